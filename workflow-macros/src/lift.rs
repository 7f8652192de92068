//! `?` inside a step's or workflow's body: each `expr?` that returns from the body itself
//! becomes `::workflow_core::__private::lift(expr)?`, which converts any
//! `std::error::Error + Send + Sync + 'static` into a retryable `workflow_core::Error` and
//! passes an `Error` through unchanged.
//!
//! `From` cannot do this: `workflow_core::Error` is itself a `std::error::Error` (so that `?`
//! takes it into `anyhow::Error` or `Box<dyn Error>` in the user's `main`), and a blanket
//! `impl<E: std::error::Error> From<E> for Error` would overlap `From<T> for T`. The macro owns
//! the body, so it converts where it can see that the body's `Result<T, Error>` is the target.
//!
//! Only the body's own `?`s are rewritten: a closure, an async block or a nested fn has a
//! return type of its own, which need not be `workflow_core::Result` (a closure returning
//! `Option` uses `?` on options). The tokens of a macro invocation are rewritten when they
//! parse as a list of expressions (`format!`, `vec!`, `assert_eq!`, ...), and left as they are
//! otherwise.

use proc_macro2::{Span, TokenStream};
use quote::{quote_spanned, ToTokens};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::visit_mut::{self, VisitMut};
use syn::{Expr, Token};

/// `block` with each of its own `expr?` rewritten as `lift(expr)?`.
pub(crate) fn body(block: &syn::Block) -> syn::Block {
    let mut block = block.clone();
    Lift { lifted: false }.visit_block_mut(&mut block);
    block
}

struct Lift {
    /// Whether anything was rewritten (in the macro invocation being visited).
    lifted: bool,
}

impl VisitMut for Lift {
    fn visit_expr_mut(&mut self, expr: &mut Expr) {
        match expr {
            // Their `?` returns from them, not from the body.
            Expr::Closure(_) | Expr::Async(_) | Expr::TryBlock(_) | Expr::Const(_) => {}
            Expr::Try(try_expr) => {
                self.visit_expr_mut(&mut try_expr.expr);
                let inner = &try_expr.expr;
                // At the `?`, but marked as the macro's: lints about the user's code
                // (clippy's `needless_question_mark` on `Ok(run.status().await?)`, whose `?`
                // converts a `RunError`) must not see `lift(..)` as written by the user.
                let span = Span::mixed_site().located_at(try_expr.question_token.span);
                let lifted: TokenStream =
                    quote_spanned!(span=> ::workflow_core::__private::lift(#inner));
                // A call expression always parses; keep the original if it somehow did not.
                if let Ok(lifted) = syn::parse2::<Expr>(lifted) {
                    *try_expr.expr = lifted;
                    self.lifted = true;
                }
            }
            _ => visit_mut::visit_expr_mut(self, expr),
        }
    }

    // A nested `fn`, `impl` or `mod` has its own return types.
    fn visit_item_mut(&mut self, _: &mut syn::Item) {}

    fn visit_macro_mut(&mut self, mac: &mut syn::Macro) {
        let list = Punctuated::<Expr, Token![,]>::parse_terminated;
        let Ok(mut exprs) = list.parse2(mac.tokens.clone()) else {
            return;
        };
        let outer = std::mem::replace(&mut self.lifted, false);
        for expr in &mut exprs {
            self.visit_expr_mut(expr);
        }
        if self.lifted {
            mac.tokens = exprs.into_token_stream();
        }
        self.lifted |= outer;
    }
}

#[cfg(test)]
mod tests {
    use quote::{quote, ToTokens};

    fn lifted(block: proc_macro2::TokenStream) -> String {
        let block: syn::Block = syn::parse2(block).unwrap();
        super::body(&block)
            .to_token_stream()
            .to_string()
            .replace(":: workflow_core :: __private :: ", "")
    }

    #[test]
    fn the_bodys_own_question_marks_are_lifted() {
        assert_eq!(
            lifted(quote!({
                let n: u32 = text.parse()?;
                let m = step_a(n).await?.len();
                if n > 1 {
                    loop {
                        break f(g()?)?;
                    }
                }
                Ok(n)
            })),
            quote!({
                let n: u32 = lift(text.parse())?;
                let m = lift(step_a(n).await)?.len();
                if n > 1 {
                    loop {
                        break lift(f(lift(g())?))?;
                    }
                }
                Ok(n)
            })
            .to_string()
        );
    }

    #[test]
    fn closures_async_blocks_and_nested_fns_keep_theirs() {
        let block = quote!({
            let f = |x: Option<u32>| Some(x? + 1);
            let a = async { Ok::<_, Error>(g()?) };
            fn helper() -> Option<u32> {
                None?
            }
            Ok(())
        });
        assert_eq!(lifted(block.clone()), block.to_string());
    }

    #[test]
    fn macro_arguments_are_lifted_when_they_are_expressions() {
        assert_eq!(
            lifted(quote!({
                let s = format!("{} {x}", a?, x = b?);
                assert_eq!(c?, 1);
                println!("{}", d);
                select! { v = f => v?, };
                Ok(())
            })),
            quote!({
                let s = format!("{} {x}", lift(a)?, x = lift(b)?);
                assert_eq!(lift(c)?, 1);
                println!("{}", d);
                select! { v = f => v?, };
                Ok(())
            })
            .to_string()
        );
    }
}
