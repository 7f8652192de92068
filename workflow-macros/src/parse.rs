//! The macro's own view of the annotated function: the `ItemFn` as written (or its signature and
//! the body's raw tokens, while the body does not parse) plus its arguments as plain
//! `name: Type` pairs. Building it validates the signature against what a recorded,
//! replayable function can be (`async`, free, concrete, owned arguments, a `Result` to record),
//! collecting every violation with the span of the token that causes it.

use std::fmt;

use proc_macro2::{Delimiter, Group, Span, TokenStream};
use quote::ToTokens;
use syn::parse::{ParseStream, Parser};
use syn::visit::{self, Visit};
use syn::{Attribute, FnArg, Ident, ItemFn, Pat, ReturnType, Signature, Type, Visibility};

use crate::errors::Errors;

/// Which attribute is being expanded; its `Display` is the attribute as the user wrote it.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    Workflow,
    Step,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Workflow => "`#[workflow]`",
            Kind::Step => "`#[step]`",
        })
    }
}

/// A validated `#[workflow]` or `#[step]` function.
pub(crate) struct Function {
    /// The function exactly as written.
    pub(crate) item: ItemFn,
    /// One per argument, in order.
    pub(crate) args: Vec<Arg>,
    /// The written return type (`Result<T>`).
    pub(crate) output: Type,
    /// `#[step(transactional)]`: its first parameter, the store's transaction (`&mut Tx<'_>`),
    /// which is not among `args` (callers do not pass it).
    pub(crate) tx: bool,
}

/// An argument `name: Type` or `mut name: Type`.
pub(crate) struct Arg {
    pub(crate) ident: Ident,
    pub(crate) ty: Type,
}

impl Function {
    /// The signature with `async` kept but without `mut` or attributes on the arguments: the
    /// generated outer function only forwards its arguments into the recorded tuple, so a user's
    /// `mut` belongs to the body (`__wf_body`), where it is used.
    pub(crate) fn forwarding_signature(&self) -> syn::Signature {
        let mut sig = self.item.sig.clone();
        if self.tx {
            // The transaction is the runtime's to pass, not the caller's.
            sig.inputs = sig.inputs.into_iter().skip(1).collect();
        }
        for input in &mut sig.inputs {
            if let FnArg::Typed(arg) = input {
                arg.attrs.clear();
                if let Pat::Ident(pat) = &mut *arg.pat {
                    pat.attrs.clear();
                    pat.mutability = None;
                }
            }
        }
        sig
    }
}

/// The annotated item, before validation.
pub(crate) enum Item {
    /// A function, body included.
    Fn(ItemFn),
    /// A function whose signature parses but whose body does not (the user is typing): `head`
    /// is the function with an empty block, `body` the braces and their tokens as written.
    UnparsedBody { head: ItemFn, body: Group },
}

/// Parses `item` as a function, keeping the body as raw tokens when only the body does not
/// parse, with a clear error when the attribute is on another item.
pub(crate) fn item(kind: Kind, item: TokenStream) -> syn::Result<Item> {
    match syn::parse2::<ItemFn>(item.clone()) {
        Ok(function) => Ok(Item::Fn(function)),
        Err(error) => match head.parse2(item.clone()) {
            Ok((head, body)) => Ok(Item::UnparsedBody { head, body }),
            Err(_) => Err(not_a_function(kind, item).unwrap_or(error)),
        },
    }
}

/// `attrs vis sig { .. }` with the block's tokens left as they are.
fn head(input: ParseStream) -> syn::Result<(ItemFn, Group)> {
    let attrs = input.call(Attribute::parse_outer)?;
    let vis: Visibility = input.parse()?;
    let sig: Signature = input.parse()?;
    let body: Group = input.parse()?;
    if body.delimiter() != Delimiter::Brace {
        return Err(syn::Error::new(body.span(), "expected `{`"));
    }
    let block = Box::new(syn::Block {
        brace_token: syn::token::Brace {
            span: body.delim_span(),
        },
        stmts: Vec::new(),
    });
    let head = ItemFn {
        attrs,
        vis,
        sig,
        block,
    };
    Ok((head, body))
}

/// Validates `item` as the function under `kind` (`transactional`: a
/// `#[step(transactional)]`, whose first parameter is `&mut Tx<'_>`), or returns every reason it
/// cannot be one.
pub(crate) fn function(kind: Kind, item: ItemFn, transactional: bool) -> syn::Result<Function> {
    let mut errors = Errors::default();
    let sig = &item.sig;
    let tx_first = transactional && sig.inputs.first().is_some_and(is_tx_param);
    // A `Tx` elsewhere gets its own error below, which says where it belongs.
    let tx_elsewhere = sig
        .inputs
        .iter()
        .skip(1)
        .any(|input| matches!(input, FnArg::Typed(arg) if mentions_tx(&arg.ty)));
    if transactional && !tx_first && !tx_elsewhere {
        let first = sig.inputs.first().map(ToTokens::to_token_stream);
        let message = "`#[step(transactional)]` takes the store's transaction as its first \
                       parameter: write `tx: &mut Tx<'_>` first (callers do not pass it)";
        match first {
            Some(first) => errors.spanned(first, message),
            None => errors.at(sig.paren_token.span.join(), message),
        }
    }

    if let Some(constness) = &sig.constness {
        errors.spanned(
            constness,
            format_args!("{kind} functions cannot be `const`"),
        );
    }
    if let Some(unsafety) = &sig.unsafety {
        errors.spanned(
            unsafety,
            format_args!(
                "{kind} functions cannot be `unsafe`: callers reach them through safe generated \
                 code; put the unsafe code in an `unsafe {{ .. }}` block inside the body"
            ),
        );
    }
    if let Some(abi) = &sig.abi {
        errors.spanned(abi, format_args!("{kind} functions cannot be `extern`"));
    }
    if sig.asyncness.is_none() {
        errors.spanned(
            sig.fn_token,
            format_args!("{kind} functions must be `async`"),
        );
    }
    let generic = format!(
        "{kind} functions cannot be generic: their arguments and result are recorded in the \
         run's history and decoded by name, so each needs one concrete type"
    );
    if !sig.generics.params.is_empty() {
        errors.spanned(&sig.generics, &generic);
    } else if let Some(where_clause) = &sig.generics.where_clause {
        errors.spanned(where_clause, &generic);
    }

    let mut args = Vec::new();
    for (i, input) in sig.inputs.iter().enumerate() {
        if tx_first && i == 0 {
            continue;
        }
        if let FnArg::Typed(arg) = input {
            if mentions_tx(&arg.ty) {
                let message = if transactional {
                    "`Tx` may only be the first parameter of a `#[step(transactional)]`, as \
                     `tx: &mut Tx<'_>`: the runtime passes it, and it is not recorded"
                } else {
                    "a `Tx` parameter needs `#[step(transactional)]`, and comes first as \
                     `tx: &mut Tx<'_>`"
                };
                errors.spanned(&arg.ty, message);
                continue;
            }
        }
        match input {
            FnArg::Receiver(receiver) => errors.spanned(
                receiver,
                format_args!(
                    "{kind} functions cannot take `self`: they are registered as free functions; \
                     move it out of the `impl` and pass what it needs as owned arguments"
                ),
            ),
            FnArg::Typed(arg) => {
                for attr in &arg.attrs {
                    if attr.path().is_ident("cfg") || attr.path().is_ident("cfg_attr") {
                        errors.spanned(
                            attr,
                            "`#[cfg]` on an argument is not supported: the recorded argument \
                             tuple must be the same in every build",
                        );
                    }
                }
                owned(&arg.ty, Position::Argument, &mut errors);
                match &*arg.pat {
                    Pat::Ident(pat) if pat.by_ref.is_none() && pat.subpat.is_none() => {
                        args.push(Arg {
                            ident: pat.ident.clone(),
                            ty: (*arg.ty).clone(),
                        });
                    }
                    pat => errors.spanned(
                        pat,
                        format_args!(
                            "{kind} arguments must be plain names such as `order: Order`: \
                             destructure inside the body"
                        ),
                    ),
                }
            }
        }
    }
    if let Some(variadic) = &sig.variadic {
        errors.spanned(
            variadic,
            format_args!("{kind} functions cannot be variadic"),
        );
    }

    let output = match &sig.output {
        ReturnType::Type(_, ty) => {
            owned(ty, Position::Result, &mut errors);
            (**ty).clone()
        }
        ReturnType::Default => {
            errors.spanned(
                &sig.ident,
                format_args!(
                    "{kind} functions must return `workflow_core::Result<T>`: the result is \
                     recorded in the run's history; add `-> Result<()>` if there is nothing to \
                     return"
                ),
            );
            // Never expanded: the error above is reported instead.
            Type::Tuple(syn::TypeTuple {
                paren_token: Default::default(),
                elems: Default::default(),
            })
        }
    };

    errors.finish(Function {
        item,
        args,
        output,
        tx: tx_first,
    })
}

/// `name: &mut Tx<..>` (any path ending in `Tx`).
fn is_tx_param(input: &FnArg) -> bool {
    let FnArg::Typed(arg) = input else {
        return false;
    };
    matches!(&*arg.pat, Pat::Ident(_))
        && matches!(&*arg.ty, Type::Reference(r)
            if r.mutability.is_some() && ends_in_tx(&r.elem))
}

fn ends_in_tx(ty: &Type) -> bool {
    matches!(ty, Type::Path(p) if p.qself.is_none()
        && p.path.segments.last().is_some_and(|s| s.ident == "Tx"))
}

/// Whether `ty` names `Tx` anywhere (`Tx<'_>`, `&Tx`, `Option<&mut Tx>`).
fn mentions_tx(ty: &Type) -> bool {
    struct Finds(bool);
    impl<'ast> Visit<'ast> for Finds {
        fn visit_path_segment(&mut self, segment: &'ast syn::PathSegment) {
            self.0 |= segment.ident == "Tx";
            visit::visit_path_segment(self, segment);
        }
    }
    let mut finds = Finds(false);
    finds.visit_type(ty);
    finds.0
}

/// A clearer error than syn's "expected `fn`" when the attribute sits on another kind of item.
fn not_a_function(kind: Kind, item: TokenStream) -> Option<syn::Error> {
    match syn::parse2::<syn::Item>(item) {
        Ok(syn::Item::Fn(_)) | Err(_) => None,
        Ok(_) => Some(syn::Error::new(
            Span::call_site(),
            format_args!("{kind} applies to an `async fn` only"),
        )),
    }
}

#[derive(Clone, Copy)]
enum Position {
    Argument,
    Result,
}

/// Records an error for each borrow or `impl Trait` in `ty`: an argument or result is
/// serialized into the run's history and decoded on replay, so it must be an owned, nameable
/// type.
fn owned(ty: &Type, position: Position, errors: &mut Errors) {
    struct Borrows<'e> {
        position: Position,
        errors: &'e mut Errors,
    }

    impl Borrows<'_> {
        fn must_be_owned(&mut self, span: impl ToTokens, why: fmt::Arguments<'_>) {
            let what = match self.position {
                Position::Argument => "arguments are recorded in the run's history, so they",
                Position::Result => "the result is recorded in the run's history, so it",
            };
            self.errors
                .spanned(span, format_args!("{what} must be owned{why}"));
        }
    }

    impl<'ast> Visit<'ast> for Borrows<'_> {
        fn visit_type_reference(&mut self, reference: &'ast syn::TypeReference) {
            let owned = owned_alternative(&reference.elem);
            let borrowed = reference.to_token_stream().to_string();
            self.must_be_owned(
                reference,
                format_args!(": use `{owned}` instead of `{}`", tidy(&borrowed)),
            );
        }

        fn visit_type_impl_trait(&mut self, impl_trait: &'ast syn::TypeImplTrait) {
            let what = match self.position {
                Position::Argument => "arguments",
                Position::Result => "results",
            };
            self.errors.spanned(
                impl_trait,
                format_args!(
                    "`impl Trait` {what} are not supported: {what} are recorded in the run's \
                     history, so each needs one concrete, owned type"
                ),
            );
        }

        fn visit_lifetime(&mut self, lifetime: &'ast syn::Lifetime) {
            if lifetime.ident != "static" {
                self.must_be_owned(
                    lifetime,
                    format_args!(
                        ", and the lifetime `{lifetime}` marks a borrow: use an owned type instead"
                    ),
                );
            }
        }

        // `fn(&str)` borrows nothing from the caller; it is rejected later as not serializable.
        fn visit_type_bare_fn(&mut self, _: &'ast syn::TypeBareFn) {}
    }

    let mut borrows = Borrows { position, errors };
    visit::visit_type(&mut borrows, ty);
}

/// The owned type to suggest for `&elem`: `String` for `str`, `Vec<T>` for `[T]`, else `elem`.
fn owned_alternative(elem: &Type) -> String {
    match elem {
        Type::Path(path) if path.qself.is_none() && path.path.is_ident("str") => "String".into(),
        Type::Slice(slice) => format!("Vec<{}>", tidy(&slice.elem.to_token_stream().to_string())),
        other => tidy(&other.to_token_stream().to_string()),
    }
}

/// Token streams print as `& 'a Vec < u8 >`; messages read better as `&'a Vec<u8>`.
pub(crate) fn tidy(tokens: &str) -> String {
    let mut text = tokens.to_owned();
    for (from, to) in [
        (" < ", "<"),
        ("< ", "<"),
        (" >", ">"),
        (" , ", ", "),
        (" :: ", "::"),
        (":: ", "::"),
        ("& ", "&"),
        ("[ ", "["),
        (" ]", "]"),
        (" ;", ";"),
        ("( ", "("),
        (" )", ")"),
        (" ::<", "::<"),
        (" . ", "."),
        (" ()", "()"),
        (" (..)", "(..)"),
    ] {
        text = text.replace(from, to);
    }
    text
}

/// Whether `ty` can be written as it is in a stand-in's signature, which has none of the
/// user's generic parameters and no lifetime but `'static`: no generic parameter of `generics`,
/// no `Self`, `impl Trait`, `_` or macro, no borrow but `&'static`, no lifetime but `'static`
/// (except inside a `fn(..)` type, whose lifetimes are its own).
pub(crate) fn nameable(ty: &Type, generics: &syn::Generics) -> bool {
    struct Check<'g> {
        params: Vec<&'g Ident>,
        in_bare_fn: usize,
        nameable: bool,
    }

    impl<'ast> Visit<'ast> for Check<'_> {
        fn visit_type_impl_trait(&mut self, _: &'ast syn::TypeImplTrait) {
            self.nameable = false;
        }

        fn visit_type_infer(&mut self, _: &'ast syn::TypeInfer) {
            self.nameable = false;
        }

        fn visit_type_macro(&mut self, _: &'ast syn::TypeMacro) {
            self.nameable = false;
        }

        fn visit_type_reference(&mut self, reference: &'ast syn::TypeReference) {
            if self.in_bare_fn == 0 && reference.lifetime.is_none() {
                self.nameable = false;
            }
            visit::visit_type_reference(self, reference);
        }

        fn visit_lifetime(&mut self, lifetime: &'ast syn::Lifetime) {
            if self.in_bare_fn == 0 && lifetime.ident != "static" {
                self.nameable = false;
            }
        }

        fn visit_type_bare_fn(&mut self, bare_fn: &'ast syn::TypeBareFn) {
            self.in_bare_fn += 1;
            visit::visit_type_bare_fn(self, bare_fn);
            self.in_bare_fn -= 1;
        }

        fn visit_ident(&mut self, ident: &'ast Ident) {
            if ident == "Self" || self.params.contains(&ident) {
                self.nameable = false;
            }
        }
    }

    let params = generics
        .params
        .iter()
        .filter_map(|param| match param {
            syn::GenericParam::Type(param) => Some(&param.ident),
            syn::GenericParam::Const(param) => Some(&param.ident),
            syn::GenericParam::Lifetime(_) => None,
        })
        .collect();
    let mut check = Check {
        params,
        in_bare_fn: 0,
        nameable: true,
    };
    check.visit_type(ty);
    check.nameable
}
