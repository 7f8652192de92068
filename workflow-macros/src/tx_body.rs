//! The scan of a `#[step(transactional)]` body for what it may not do and the macro can see:
//! writing a stream (`stream(..)`), whose chunks would be written outside the step's
//! transaction. Step calls cannot be told from other calls here; the runtime refuses them
//! (a fatal error of the step).

use syn::visit::{self, Visit};

use crate::errors::Errors;

/// Reports every `stream(..)` call in `item`'s body, nested closures and async blocks included,
/// nested items (`fn`, `impl`) excluded.
pub(crate) fn scan(item: &syn::ItemFn, errors: &mut Errors) {
    struct Scan<'e> {
        errors: &'e mut Errors,
    }

    impl<'ast> Visit<'ast> for Scan<'_> {
        fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
            if let syn::Expr::Path(path) = &*call.func {
                if path
                    .path
                    .segments
                    .last()
                    .is_some_and(|s| s.ident == "stream")
                {
                    self.errors.spanned(
                        call,
                        "`stream(..)` inside a `#[step(transactional)]`: its body may only use \
                         its transaction (`tx`), and a stream's chunks would be written outside \
                         it; write the stream from an ordinary step",
                    );
                }
            }
            visit::visit_expr_call(self, call);
        }

        fn visit_item(&mut self, _: &'ast syn::Item) {}
    }

    Scan { errors }.visit_block(&item.block);
}
