//! Code generation: turns a validated [`Function`] into the user's function rewritten around the
//! runtime's `::workflow_core::__private` entry points, plus its registration.
//!
//! Generated locals and helper items are named `__wf_*` (`__wf_body`, `__wf_args`,
//! `__wf_arg_<name>`) with `Span::mixed_site()`, so they never capture or shadow user names. The
//! user's own tokens (signature, argument patterns, body) keep their spans, so warnings about them
//! (unused argument, needless `mut`) point at the user's code, once. Every check that can fail to
//! type-check carries the span of the user's type it checks.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::parse::Parse;
use syn::spanned::Spanned;
use syn::{Attribute, Ident};

use crate::args::{StepArgs, WorkflowArgs, DEFAULT_MAX_RETRIES};
use crate::parse::{self, Function, Kind};

/// Expands `#[workflow(args)] item`; errors come back as `compile_error!`s.
pub(crate) fn workflow(args: TokenStream, item: TokenStream) -> TokenStream {
    match parse_all::<WorkflowArgs>(Kind::Workflow, args, item.clone()) {
        Ok((args, function)) => expand_workflow(&args, &function),
        Err(error) => fallback(error, item),
    }
}

/// Expands `#[step(args)] item`; errors come back as `compile_error!`s.
pub(crate) fn step(args: TokenStream, item: TokenStream) -> TokenStream {
    match parse_all::<StepArgs>(Kind::Step, args, item.clone()) {
        Ok((args, function)) => expand_step(&args, &function),
        Err(error) => fallback(error, item),
    }
}

/// Parses the options and the function, reporting the errors of both at once.
fn parse_all<A: Parse>(
    kind: Kind,
    args: TokenStream,
    item: TokenStream,
) -> syn::Result<(A, Function)> {
    match (syn::parse2::<A>(args), parse::function(kind, item)) {
        (Ok(args), Ok(function)) => Ok((args, function)),
        (Err(error), Ok(_)) | (Ok(_), Err(error)) => Err(error),
        (Err(mut error), Err(more)) => {
            error.combine(more);
            Err(error)
        }
    }
}

// Input:
//     <errors>, #[step] async fn f(..) -> R { BODY }
// Output:
//     ::core::compile_error! { "..." }   // one per error, each at its span
//     async fn f(..) -> R { BODY }       // unchanged, so the IDE still sees the function
fn fallback(error: syn::Error, item: TokenStream) -> TokenStream {
    let mut tokens = error.to_compile_error();
    tokens.extend(item);
    tokens
}

// Input:
//     #[step(max_retries = 5)]
//     pub async fn charge_user(user_id: String, mut amount: u64) -> Result<Receipt> { BODY }
// Output:
//     #[doc(hidden)] #[allow(non_upper_case_globals)]
//     static __WF_STEP_charge_user: StepDef = StepDef {
//         name: concat!(module_path!(), "::", "charge_user"),  // or the `name = ".."` literal
//         max_retries: 5,                                      // default 3
//     };
//     inventory::submit! { StepRegistration { def: &__WF_STEP_charge_user } }
//     pub async fn charge_user(user_id: String, amount: u64) -> Result<Receipt> {
//         async fn __wf_body(user_id: String, mut amount: u64) -> Result<Receipt> BODY
//         let _ = assert_value::<String>;                   // one per argument, at its type
//         let _ = assert_value::<u64>;
//         let _ = assert_value::<<Result<Receipt> as WorkflowReturn>::Ok>;   // at the return type
//         call_step(&__WF_STEP_charge_user, (user_id, amount),
//                   |(__wf_arg_user_id, __wf_arg_amount)| __wf_body(__wf_arg_user_id, __wf_arg_amount))
//             .await
//     }
// (all runtime paths are `::workflow_core::__private::..`)
fn expand_step(args: &StepArgs, function: &Function) -> TokenStream {
    let item = &function.item;
    let ident = &item.sig.ident;
    let def = format_ident!("__WF_STEP_{}", ident);
    let name = stable_name(args.name.as_ref(), ident);
    let max_retries = match &args.max_retries {
        Some(max_retries) => max_retries.to_token_stream(),
        None => proc_macro2::Literal::u32_unsuffixed(DEFAULT_MAX_RETRIES).into_token_stream(),
    };
    let cfgs = cfg_attrs(&item.attrs);
    let attrs = &item.attrs;
    let vis = &item.vis;
    let sig = function.forwarding_signature();
    let body_fn = body_fn(function, &[]);
    let checks = value_checks(function);
    let body = body_ident();
    let forwarded = forwarded_args(function);
    let locals = local_args(function);

    let mut outer_block = TokenStream::new();
    item.block.brace_token.surround(&mut outer_block, |tokens| {
        tokens.extend(quote! {
            #body_fn
            #checks
            ::workflow_core::__private::call_step(
                &#def,
                (#(#forwarded,)*),
                |(#(#locals,)*)| #body(#(#locals),*),
            )
            .await
        });
    });

    quote! {
        #(#cfgs)*
        #[doc(hidden)]
        #[allow(non_upper_case_globals)]
        static #def: ::workflow_core::__private::StepDef = ::workflow_core::__private::StepDef {
            name: #name,
            max_retries: #max_retries,
        };

        #(#cfgs)*
        ::workflow_core::__private::inventory::submit! {
            ::workflow_core::__private::StepRegistration { def: &#def }
        }

        #(#attrs)*
        #vis #sig #outer_block
    }
}

// Input:
//     #[workflow]
//     pub async fn process_order(order_id: String, mut qty: u32) -> Result<OrderResult> { BODY }
// Output:
//     #[doc(hidden)] #[allow(non_camel_case_types)]
//     pub struct __WorkflowDef_process_order;                  // the fn's visibility
//     impl WorkflowDef for __WorkflowDef_process_order {
//         const NAME: &'static str = concat!(module_path!(), "::", "process_order");  // or `name`
//         type Args = (String, u32);
//         type Output = <Result<OrderResult> as WorkflowReturn>::Ok;
//         fn call(__wf_args: Self::Args) -> BoxFuture<'static, Result<Self::Output, Error>> {
//             async fn __wf_body(order_id: String, mut qty: u32) -> Result<OrderResult> BODY
//             let (__wf_arg_order_id, __wf_arg_qty) = __wf_args;
//             Box::pin(async move {
//                 WorkflowReturn::into_result(__wf_body(__wf_arg_order_id, __wf_arg_qty).await)
//             })
//         }
//     }
//     inventory::submit! { WorkflowRegistration::of::<__WorkflowDef_process_order>() }
//     pub fn process_order(order_id: String, qty: u32) -> WorkflowCall<__WorkflowDef_process_order> {
//         let _ = assert_value::<String>;                   // one per argument, at its type
//         let _ = assert_value::<u32>;
//         let _ = assert_value::<<Result<OrderResult> as WorkflowReturn>::Ok>;
//         WorkflowCall::new((order_id, qty))
//     }
// (all runtime paths are `::workflow_core::__private::..`; `Error` is `::workflow_core::Error`)
//
// The signature becomes a plain `fn` returning `WorkflowCall<Def>` so that `rt.start(process_order,
// args)` finds the definition through the type system. The body moves into `WorkflowDef::call`,
// outside the user's fn, so the user's lint attributes are copied onto `__wf_body` there.
fn expand_workflow(args: &WorkflowArgs, function: &Function) -> TokenStream {
    let item = &function.item;
    let ident = &item.sig.ident;
    let def = format_ident!("__WorkflowDef_{}", ident);
    let name = stable_name(args.name.as_ref(), ident);
    let cfgs = cfg_attrs(&item.attrs);
    let lints: Vec<&Attribute> = item
        .attrs
        .iter()
        .filter(|attr| {
            // Not `expect`: the copy left on the outer fn would then go unfulfilled.
            ["allow", "warn", "deny", "forbid"]
                .iter()
                .any(|lint| attr.path().is_ident(lint))
        })
        .collect();
    let attrs = &item.attrs;
    let vis = &item.vis;
    let body_fn = body_fn(function, &lints);
    let checks = value_checks(function);
    let body = body_ident();
    let args_var = Ident::new("__wf_args", Span::mixed_site());
    let forwarded = forwarded_args(function);
    let locals = local_args(function);
    let arg_types = args_type(function);
    let output = ok_type(function);

    let mut sig = function.forwarding_signature();
    sig.asyncness = None;
    let arrow = match &item.sig.output {
        syn::ReturnType::Type(arrow, _) => *arrow,
        syn::ReturnType::Default => Default::default(),
    };
    sig.output = syn::ReturnType::Type(
        arrow,
        Box::new(syn::parse_quote!(::workflow_core::__private::WorkflowCall<#def>)),
    );

    let mut outer_block = TokenStream::new();
    item.block.brace_token.surround(&mut outer_block, |tokens| {
        tokens.extend(quote! {
            #checks
            ::workflow_core::__private::WorkflowCall::new((#(#forwarded,)*))
        });
    });

    quote! {
        #(#cfgs)*
        #[doc(hidden)]
        #[allow(non_camel_case_types)]
        #vis struct #def;

        #(#cfgs)*
        impl ::workflow_core::__private::WorkflowDef for #def {
            const NAME: &'static str = #name;
            type Args = #arg_types;
            type Output = #output;

            fn call(
                #args_var: Self::Args,
            ) -> ::workflow_core::__private::BoxFuture<
                'static,
                ::core::result::Result<Self::Output, ::workflow_core::Error>,
            > {
                #body_fn
                let (#(#locals,)*) = #args_var;
                ::std::boxed::Box::pin(async move {
                    ::workflow_core::__private::WorkflowReturn::into_result(
                        #body(#(#locals),*).await,
                    )
                })
            }
        }

        #(#cfgs)*
        ::workflow_core::__private::inventory::submit! {
            ::workflow_core::__private::WorkflowRegistration::of::<#def>()
        }

        #(#attrs)*
        #vis #sig #outer_block
    }
}

fn body_ident() -> Ident {
    Ident::new("__wf_body", Span::mixed_site())
}

/// `async fn __wf_body(<the user's arguments>) -> <the user's return type> <the user's block>`:
/// the user's code as written, `mut` and argument attributes included.
fn body_fn(function: &Function, attrs: &[&Attribute]) -> TokenStream {
    let sig = &function.item.sig;
    let body = body_ident();
    let inputs = &sig.inputs;
    let output = &sig.output;
    let block = &function.item.block;
    quote! {
        #(#attrs)*
        async fn #body(#inputs) #output #block
    }
}

/// `let _ = assert_value::<T>;` per argument type and for the result's `Ok` type, each spanned
/// at the user's type so an unserializable one is reported there.
fn value_checks(function: &Function) -> TokenStream {
    let mut checks = TokenStream::new();
    for arg in &function.args {
        let ty = &arg.ty;
        checks.extend(quote_spanned! {ty.span()=>
            let _ = ::workflow_core::__private::assert_value::<#ty>;
        });
    }
    let ty = &function.output;
    let ok = ok_type(function);
    checks.extend(quote_spanned! {ty.span()=>
        let _ = ::workflow_core::__private::assert_value::<#ok>;
    });
    checks
}

/// `<R as WorkflowReturn>::Ok`, spanned at the return type `R`.
fn ok_type(function: &Function) -> TokenStream {
    let ty = &function.output;
    quote_spanned! {ty.span()=>
        <#ty as ::workflow_core::__private::WorkflowReturn>::Ok
    }
}

/// The user's argument names as the outer function uses them to build the argument tuple.
/// They resolve to its parameters but carry the call-site span: the user never wrote these uses,
/// so lints about uses (clippy's `used_underscore_binding` on `_note: String`) must not fire.
fn forwarded_args(function: &Function) -> Vec<Ident> {
    function
        .args
        .iter()
        .map(|arg| {
            let mut ident = arg.ident.clone();
            ident.set_span(Span::call_site());
            ident
        })
        .collect()
}

/// `__wf_arg_<name>` per argument: the generated locals that unpack the argument tuple.
fn local_args(function: &Function) -> Vec<Ident> {
    function
        .args
        .iter()
        .map(|arg| {
            Ident::new(
                &format!("__wf_arg_{}", arg.ident.unraw()),
                Span::mixed_site(),
            )
        })
        .collect()
}

/// The argument types as a tuple type: `()`, `(A,)`, `(A, B)`.
fn args_type(function: &Function) -> TokenStream {
    let types = function.args.iter().map(|arg| &arg.ty);
    quote!((#(#types,)*))
}

/// The `name = ".."` literal, or `concat!(module_path!(), "::", "<fn name>")`.
fn stable_name(name: Option<&syn::LitStr>, ident: &Ident) -> TokenStream {
    match name {
        Some(name) => name.to_token_stream(),
        None => {
            let fn_name = ident.unraw().to_string();
            quote!(::core::concat!(::core::module_path!(), "::", #fn_name))
        }
    }
}

/// The `#[cfg(..)]` attributes written after the macro's own: they must also gate the generated
/// registration, or it would outlive the function it registers.
fn cfg_attrs(attrs: &[Attribute]) -> Vec<&Attribute> {
    attrs
        .iter()
        .filter(|attr| attr.path().is_ident("cfg"))
        .collect()
}

#[cfg(test)]
mod tests;
