//! Code generation: turns a validated [`Function`] into the user's function rewritten around the
//! runtime's `::workflow_core::__private` entry points, plus its registration.
//!
//! Generated locals and helper items are named `__wf_*` (`__wf_body`, `__wf_args`,
//! `__wf_arg_<name>`) with `Span::mixed_site()`, so they never capture or shadow user names. The
//! user's own tokens (signature, argument patterns, body) keep their spans, so warnings about them
//! (unused argument, needless `mut`) point at the user's code, once. Every check that can fail to
//! type-check carries the span of the user's type it checks, and the generated calls that would
//! repeat a failed check go through selectors (`StepCall`, `ReturnOf`) that fall back to
//! bound-free stand-ins, so the user sees the check's error and not a cascade at the attribute.
//!
//! A function the macro rejects (its options or signature, or a body that does not parse yet)
//! is emitted as written inside a `stand_in` of the same name, so that its callers elsewhere
//! still type-check and the user sees the macro's errors only.
//!
//! The body of a `#[workflow]` is first scanned for nondeterminism (`analyze`), then stripped of
//! its opt-out attributes (`allow`); body errors leave the generated code complete, so the rest
//! of the crate (`rt.start(wf, ..)` calls) still type-checks and reports nothing more.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::parse::Parse;
use syn::spanned::Spanned;
use syn::{Attribute, Ident};

use crate::args::{StepArgs, WorkflowArgs, DEFAULT_MAX_RETRIES};
use crate::errors::Errors;
use crate::parse::{self, Function, Kind};
use crate::{allow, analyze};

/// Expands `#[workflow(args)] item`; errors come back as `compile_error!`s.
pub(crate) fn workflow(args: TokenStream, item: TokenStream) -> TokenStream {
    emit(expand::<WorkflowArgs>(
        Kind::Workflow,
        args,
        item,
        expand_workflow,
    ))
}

/// Expands `#[step(args)] item`; errors come back as `compile_error!`s.
pub(crate) fn step(args: TokenStream, item: TokenStream) -> TokenStream {
    emit(expand::<StepArgs>(Kind::Step, args, item, expand_step))
}

// Input:
//     #[workflow(OPTIONS)] async fn f(..) -> R { BODY }
// Output (the generated code and every error found, separately, for the snapshot tests):
//     OK, OK:        expand_workflow / expand_step, with the opt-out attributes removed from BODY;
//                    body errors (the determinism scan) come along, the code is still complete
//     otherwise:     `stand_in`: the function as written (opt-outs removed) inside a stand-in
//                    that keeps `rt.start(f, ..)` and `f(..).await` elsewhere type-checking
//     BODY does not parse: `stand_in` around the function with BODY as raw tokens, and no error
//                    of ours for BODY: rustc reports the syntax error when it parses them, and
//                    a second report of the same mistake in syn's words would only be noise
//     not even the signature parses: the tokens as written and syn's error
fn expand<A: Parse + Options>(
    kind: Kind,
    args: TokenStream,
    item: TokenStream,
    generate: fn(&A, &Function) -> TokenStream,
) -> (TokenStream, Option<syn::Error>) {
    let (item, raw_body) = match parse::item(kind, item.clone()) {
        Ok(parse::Item::Fn(item)) => (item, None),
        Ok(parse::Item::UnparsedBody { head, body }) => (head, Some(body)),
        Err(error) => return (item, Some(error)),
    };
    let mut errors = Errors::default();
    let args = syn::parse2::<A>(args)
        .map_err(|error| errors.push(error))
        .ok();

    // The scan reads the opt-outs, so it runs on the body as written; everything after it
    // sees the body without them. (An unparsed body is an empty block here.)
    let mut body_errors = Errors::default();
    if let Kind::Workflow = kind {
        analyze::workflow(&item, &mut body_errors);
    }
    if args.as_ref().is_some_and(A::transactional) {
        crate::tx_body::scan(&item, &mut body_errors);
    }
    let mut stripped = item;
    let mut opt_out_errors = Errors::default();
    allow::strip(kind, &mut stripped, &mut opt_out_errors);
    let raw_body = raw_body.map(|body| allow::strip_raw(kind, &body, &mut opt_out_errors));

    let transactional = args.as_ref().is_some_and(A::transactional);
    let function = parse::function(kind, stripped.clone(), transactional)
        .map_err(|error| errors.push(error))
        .ok();
    errors.extend(opt_out_errors);
    errors.extend(body_errors);
    let tokens = match (args, function, raw_body) {
        (Some(args), Some(function), None) => generate(&args, &function),
        (_, _, raw_body) => stand_in(kind, &stripped, raw_body.as_ref()),
    };
    (tokens, errors.into_error())
}

/// What `expand` needs to know of the options before it validates the function.
trait Options {
    /// `#[step(transactional)]`.
    fn transactional(&self) -> bool {
        false
    }
}

impl Options for WorkflowArgs {}

impl Options for StepArgs {
    fn transactional(&self) -> bool {
        self.transactional
    }
}

// Input:
//     <errors>, <generated code or the function as written>
// Output:
//     ::core::compile_error! { "..." }   // one per error, each at its span
//     <generated code or the function>   // so the IDE still sees the function
fn emit((tokens, errors): (TokenStream, Option<syn::Error>)) -> TokenStream {
    let mut emitted = errors
        .map(|errors| errors.to_compile_error())
        .unwrap_or_default();
    emitted.extend(tokens);
    emitted
}

// Input:
//     #[step(name = "billing.charge", max_retries = 5)]
//     pub async fn charge_user(user_id: String, mut amount: u64) -> Result<Receipt> { BODY }
// Output:
//     #[doc(hidden)] #[allow(non_upper_case_globals)]
//     static __WF_STEP_charge_user: StepDef = StepDef {
//         name: "billing.charge",          // default: concat!(module_path!(), "::", "charge_user")
//         max_retries: 5,                  // default 3
//         timeout: None,                   // `timeout = "30s"`: Some(Duration::from_millis(30000))
//     };
//     inventory::submit! { StepRegistration { def: &__WF_STEP_charge_user } }
//     #[doc(hidden)] #[macro_export]       // only with `name = ".."`: a second step of that
//     macro_rules! __step_named_billing_charge__<hash> { () => {} }   // name in the crate clashes
//     pub async fn charge_user(user_id: String, amount: u64) -> Result<Receipt> {
//         async fn __wf_body(user_id: String, mut amount: u64) -> Result<Receipt> BODY
//                                           // BODY's own `expr?`s as `lift(expr)?` (see `lift`)
//         let _ = assert_value::<String>;                   // one per argument, at its type
//         let _ = assert_value::<u64>;
//         let _ = assert_value::<<Result<Receipt> as WorkflowReturn>::Ok>;   // at the return type
//         use {RecordedStep as _, UnrecordableStep as _, RecordedReturn as _, UnrecordedReturn as _};
//         (&ReturnOf::<Result<Receipt>>::new()).declared(
//             (&StepCall::<(String, u64), <Result<Receipt> as WorkflowReturn>::Ok>::new())
//                 .call_step(&__WF_STEP_charge_user, (user_id, amount),
//                     |(__wf_arg_user_id, __wf_arg_amount)| async move {
//                         (&ReturnOf::<Result<Receipt>>::new())
//                             .result_of(__wf_body(__wf_arg_user_id, __wf_arg_amount).await)
//                     })
//                 .await,
//         )
//     }
// (all runtime paths are `::workflow_core::__private::..`)
//
// `StepCall` picks `call_step` when the argument tuple and the result can be recorded, and
// otherwise a stand-in with no bounds (method resolution prefers `RecordedStep`, implemented on
// `StepCall` itself, to `UnrecordableStep`, implemented on `&StepCall`, whenever its bounds
// hold: all types are concrete here). An unserializable type is then reported once, by its
// `assert_value` at its span, and not again at the attribute by `call_step`'s bounds.
// `ReturnOf` does the same for a return type that is not `workflow_core::Result<T>`: it converts
// (as the identity) between the declared type and the `Result<T, Error>` the runtime records.
fn expand_step(args: &StepArgs, function: &Function) -> TokenStream {
    let item = &function.item;
    let ident = &item.sig.ident;
    let def = format_ident!("__WF_STEP_{}", ident);
    let name = stable_name(args.name.as_ref(), ident);
    let max_retries = match &args.max_retries {
        Some(max_retries) => max_retries.to_token_stream(),
        None => proc_macro2::Literal::u32_unsuffixed(DEFAULT_MAX_RETRIES).into_token_stream(),
    };
    let timeout = match args.timeout_ms {
        Some(ms) => {
            let ms = proc_macro2::Literal::u64_unsuffixed(ms);
            quote! { ::core::option::Option::Some(::core::time::Duration::from_millis(#ms)) }
        }
        None => quote! { ::core::option::Option::None },
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
    let arg_types = args_type(function);
    let output = ok_type(function);
    let ret = &function.output;
    let unique_name = unique_name(Kind::Step, args.name.as_ref(), &cfgs);

    if function.tx {
        return expand_tx_step(args, function, &def, &name);
    }
    let mut outer_block = TokenStream::new();
    item.block.brace_token.surround(&mut outer_block, |tokens| {
        tokens.extend(quote! {
            #body_fn
            #checks
            use ::workflow_core::__private::{
                RecordedReturn as _, RecordedStep as _, UnrecordableStep as _,
                UnrecordedReturn as _,
            };
            (&::workflow_core::__private::ReturnOf::<#ret>::new()).declared(
                (&::workflow_core::__private::StepCall::<#arg_types, #output>::new())
                    .call_step(
                        &#def,
                        (#(#forwarded,)*),
                        |(#(#locals,)*)| async move {
                            (&::workflow_core::__private::ReturnOf::<#ret>::new())
                                .result_of(#body(#(#locals),*).await)
                        },
                    )
                    .await,
            )
        });
    });

    quote! {
        #(#cfgs)*
        #[doc(hidden)]
        #[allow(non_upper_case_globals)]
        static #def: ::workflow_core::__private::StepDef = ::workflow_core::__private::StepDef {
            name: #name,
            max_retries: #max_retries,
            timeout: #timeout,
        };

        #(#cfgs)*
        ::workflow_core::__private::inventory::submit! {
            ::workflow_core::__private::StepRegistration { def: &#def }
        }

        #unique_name

        #(#attrs)*
        #vis #sig #outer_block
    }
}

// Input:
//     #[step(transactional, name = "ledger.debit")]
//     pub async fn debit(tx: &mut Tx<'_>, account: String, cents: i64) -> Result<i64> { BODY }
// Output (the definition, registration and name marker as for `expand_step`):
//     pub async fn debit(account: String, cents: i64) -> Result<i64> {   // no `tx`: the runtime's
//         async fn __wf_body(tx: &mut Tx<'_>, account: String, cents: i64) -> Result<i64> BODY
//         fn __wf_tx_body<'__wf>(__wf_tx: &'__wf mut Tx<'_>, (__wf_arg_account, __wf_arg_cents):
//             (String, i64)) -> BoxFuture<'__wf, Result<i64>> {
//             Box::pin(__wf_body(__wf_tx, __wf_arg_account, __wf_arg_cents))
//         }
//         <the value checks, the selector imports>
//         (&ReturnOf::<Result<i64>>::new()).declared(
//             (&StepCall::<(String, i64), <Result<i64> as WorkflowReturn>::Ok>::new())
//                 .call_tx_step(&__WF_STEP_debit, (account, cents),
//                     |(__wf_arg_account, __wf_arg_cents)| async move {
//                         match transactional(&__WF_STEP_debit, __wf_tx_body,
//                                             (__wf_arg_account, __wf_arg_cents)).await {
//                             Ok(__wf_r) => (&ReturnOf::<Result<i64>>::new()).result_of(__wf_r),
//                             Err(__wf_e) => Err(__wf_e),   // no transaction: outside a run
//                         }
//                     })
//                 .await,
//         )
//     }
// (all runtime paths are `::workflow_core::__private::..`; `Tx` is `::workflow_core::Tx`)
//
// The body is a fn item, not a closure, so that it is generic over the borrow of the
// transaction (`for<'a, 'b> fn(&'a mut Tx<'b>, A) -> BoxFuture<'a, R>`), which closures
// cannot be written to be. Each attempt's body runs on the transaction its attempt opened.
fn expand_tx_step(
    args: &StepArgs,
    function: &Function,
    def: &Ident,
    name: &TokenStream,
) -> TokenStream {
    let item = &function.item;
    let max_retries = match &args.max_retries {
        Some(max_retries) => max_retries.to_token_stream(),
        None => proc_macro2::Literal::u32_unsuffixed(DEFAULT_MAX_RETRIES).into_token_stream(),
    };
    let timeout = match args.timeout_ms {
        Some(ms) => {
            let ms = proc_macro2::Literal::u64_unsuffixed(ms);
            quote! { ::core::option::Option::Some(::core::time::Duration::from_millis(#ms)) }
        }
        None => quote! { ::core::option::Option::None },
    };
    let cfgs = cfg_attrs(&item.attrs);
    let attrs = &item.attrs;
    let vis = &item.vis;
    let sig = function.forwarding_signature();
    let body_fn = body_fn(function, &[]);
    let checks = value_checks(function);
    let body = body_ident();
    let tx_body = Ident::new("__wf_tx_body", Span::mixed_site());
    let tx_var = Ident::new("__wf_tx", Span::mixed_site());
    let result_var = Ident::new("__wf_r", Span::mixed_site());
    let error_var = Ident::new("__wf_e", Span::mixed_site());
    let life = syn::Lifetime::new("'__wf", Span::mixed_site());
    let forwarded = forwarded_args(function);
    let locals = local_args(function);
    let arg_types = args_type(function);
    let output = ok_type(function);
    let ret = &function.output;
    let unique_name = unique_name(Kind::Step, args.name.as_ref(), &cfgs);

    let mut outer_block = TokenStream::new();
    item.block.brace_token.surround(&mut outer_block, |tokens| {
        tokens.extend(quote! {
            #body_fn
            fn #tx_body<#life>(
                #tx_var: &#life mut ::workflow_core::Tx<'_>,
                (#(#locals,)*): #arg_types,
            ) -> ::workflow_core::__private::BoxFuture<#life, #ret> {
                ::std::boxed::Box::pin(#body(#tx_var, #(#locals),*))
            }
            #checks
            use ::workflow_core::__private::{
                RecordedReturn as _, RecordedStep as _, UnrecordableStep as _,
                UnrecordedReturn as _,
            };
            (&::workflow_core::__private::ReturnOf::<#ret>::new()).declared(
                (&::workflow_core::__private::StepCall::<#arg_types, #output>::new())
                    .call_tx_step(
                        &#def,
                        (#(#forwarded,)*),
                        |(#(#locals,)*)| async move {
                            match ::workflow_core::__private::transactional(
                                &#def,
                                #tx_body,
                                (#(#locals,)*),
                            )
                            .await
                            {
                                ::core::result::Result::Ok(#result_var) => {
                                    (&::workflow_core::__private::ReturnOf::<#ret>::new())
                                        .result_of(#result_var)
                                }
                                ::core::result::Result::Err(#error_var) => {
                                    ::core::result::Result::Err(#error_var)
                                }
                            }
                        },
                    )
                    .await,
            )
        });
    });

    quote! {
        #(#cfgs)*
        #[doc(hidden)]
        #[allow(non_upper_case_globals)]
        static #def: ::workflow_core::__private::StepDef = ::workflow_core::__private::StepDef {
            name: #name,
            max_retries: #max_retries,
            timeout: #timeout,
        };

        #(#cfgs)*
        ::workflow_core::__private::inventory::submit! {
            ::workflow_core::__private::StepRegistration { def: &#def }
        }

        #unique_name

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
//         const QUEUE: Option<&'static str> = Some("payments");   // only with `queue = ".."`
//         type Args = (String, u32);                          // spanning the parameter list
//         type Output = <Result<OrderResult> as WorkflowReturn>::Ok;   // spanning the return type
//         fn call(__wf_args: Self::Args) -> BoxFuture<'static, Result<Self::Output, Error>> {
//             #[deny(clippy::disallowed_methods)]                // the second line of defence
//             async fn __wf_body(order_id: String, mut qty: u32) -> Result<OrderResult> BODY
//             let _ = assert_value::<String>;                   // one per argument, at its type
//             let _ = assert_value::<u32>;
//             let _ = assert_value::<<Result<OrderResult> as WorkflowReturn>::Ok>;   // at the return
//             let (__wf_arg_order_id, __wf_arg_qty) = __wf_args;
//             Box::pin(async move {
//                 (&ReturnOf::<Result<OrderResult>>::new())     // see `expand_step`
//                     .result_of(__wf_body(__wf_arg_order_id, __wf_arg_qty).await)
//             })
//         }
//         fn encode_args(__wf_value: &Self::Args) -> Result<Value, serde_json::Error> {
//             (&ValueOf::<Self::Args>::new()).encode(__wf_value)
//         }
//         fn decode_args(__wf_value: Value) -> Result<Self::Args, serde_json::Error> {
//             (&ValueOf::<Self::Args>::new()).decode(__wf_value)
//         }
//         fn encode_output(__wf_value: &Self::Output) -> Result<Value, serde_json::Error> {
//             (&ValueOf::<Self::Output>::new()).encode(__wf_value)
//         }
//     }
//     inventory::submit! { WorkflowRegistration::of::<__WorkflowDef_process_order>() }
//     const _: () = { let _ = process_order; };     // registered, so used: no `dead_code`
//     pub fn process_order(order_id: String, qty: u32) -> WorkflowCall<__WorkflowDef_process_order> {
//         WorkflowCall::new((order_id, qty))
//     }
// (all runtime paths are `::workflow_core::__private::..`; `Error` is `::workflow_core::Error`;
// with `name = ".."` the same `macro_rules!` marker as for steps rejects a second workflow of
// that name in the crate)
//
// The signature becomes a plain `fn` returning `WorkflowCall<Def>` so that `rt.start(process_order,
// args)` finds the definition through the type system. That impl must therefore be well-formed
// even when a type cannot be recorded: `WorkflowDef` puts no serde bounds on `Args`/`Output`, and
// the generated `encode_*`/`decode_*` go through `ValueOf`, which picks serde when the type can be
// recorded and otherwise a stand-in with no bounds (as `StepCall` does for steps). The type is
// then reported once, by its `assert_value` at its span, not by the impl nor at `rt.start`. The
// registration stays a const expression: `WorkflowRegistration::of` only takes `NAME` and a fn
// pointer to a generic runner that calls these methods. The body moves into `WorkflowDef::call`,
// outside the user's fn, so the user's lint attributes are copied onto `__wf_body` there, after
// the generated `deny`, so that an `allow` of the user's wins.
fn expand_workflow(args: &WorkflowArgs, function: &Function) -> TokenStream {
    let item = &function.item;
    let ident = &item.sig.ident;
    let def = format_ident!("__WorkflowDef_{}", ident);
    let name = stable_name(args.name.as_ref(), ident);
    let cfgs = cfg_attrs(&item.attrs);
    let deny_disallowed: Attribute = syn::parse_quote!(#[deny(clippy::disallowed_methods)]);
    let lints: Vec<&Attribute> = std::iter::once(&deny_disallowed)
        .chain(lint_attrs(&item.attrs))
        .collect();
    let attrs = &item.attrs;
    let vis = &item.vis;
    let body_fn = body_fn(function, &lints);
    let body = body_ident();
    let args_var = Ident::new("__wf_args", Span::mixed_site());
    let value_var = Ident::new("__wf_value", Span::mixed_site());
    let checks = value_checks(function);
    let forwarded = forwarded_args(function);
    let locals = local_args(function);
    let arg_types = args_type(function);
    let output = ok_type(function);
    let ret = &function.output;
    let unique_name = unique_name(Kind::Workflow, args.name.as_ref(), &cfgs);
    // Only when given, so that the trait's default (`None`) stands otherwise.
    let queue = args.queue.as_ref().map(|q| {
        quote_spanned! {q.span()=>
            const QUEUE: ::core::option::Option<&'static str> = ::core::option::Option::Some(#q);
        }
    });

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
            #queue
            type Args = #arg_types;
            type Output = #output;

            fn call(
                #args_var: Self::Args,
            ) -> ::workflow_core::__private::BoxFuture<
                'static,
                ::core::result::Result<Self::Output, ::workflow_core::Error>,
            > {
                #body_fn
                #checks
                use ::workflow_core::__private::{RecordedReturn as _, UnrecordedReturn as _};
                let (#(#locals,)*) = #args_var;
                ::std::boxed::Box::pin(async move {
                    (&::workflow_core::__private::ReturnOf::<#ret>::new())
                        .result_of(#body(#(#locals),*).await)
                })
            }

            fn encode_args(
                #value_var: &Self::Args,
            ) -> ::core::result::Result<
                ::workflow_core::__private::serde_json::Value,
                ::workflow_core::__private::serde_json::Error,
            > {
                use ::workflow_core::__private::{RecordedValue as _, UnrecordableValue as _};
                (&::workflow_core::__private::ValueOf::<Self::Args>::new()).encode(#value_var)
            }

            fn decode_args(
                #value_var: ::workflow_core::__private::serde_json::Value,
            ) -> ::core::result::Result<
                Self::Args,
                ::workflow_core::__private::serde_json::Error,
            > {
                use ::workflow_core::__private::{RecordedValue as _, UnrecordableValue as _};
                (&::workflow_core::__private::ValueOf::<Self::Args>::new()).decode(#value_var)
            }

            fn encode_output(
                #value_var: &Self::Output,
            ) -> ::core::result::Result<
                ::workflow_core::__private::serde_json::Value,
                ::workflow_core::__private::serde_json::Error,
            > {
                use ::workflow_core::__private::{RecordedValue as _, UnrecordableValue as _};
                (&::workflow_core::__private::ValueOf::<Self::Output>::new()).encode(#value_var)
            }
        }

        #(#cfgs)*
        ::workflow_core::__private::inventory::submit! {
            ::workflow_core::__private::WorkflowRegistration::of::<#def>()
        }

        // A worker binary may only register the workflow and never call the fn itself.
        #(#cfgs)*
        #[allow(deprecated)]
        const _: () = {
            let _ = #ident;
        };

        #unique_name

        #(#attrs)*
        #vis #sig #outer_block
    }
}

// Input (rejected: not `async`, a borrowed argument, no return type; or a body that does not
// parse, then BODY is its raw tokens):
//     #[workflow] pub fn process(order: &Order, qty: u32) { BODY }
// Output:
//     pub fn process<__WfArg0: 'static>(order: __WfArg0, qty: u32)
//         -> WorkflowCall<Rejected<(__WfArg0, u32), ()>>
//     {
//         #[allow(dead_code)]
//         fn process(order: &Order, qty: u32) { BODY }     // as written, lint attributes kept
//         WorkflowCall::new((order, qty))
//     }
// and for `#[step]`, the outer function is `async fn` and ends with
//         let _ = (order, qty);
//         panic!("..")                     // reached only if this compiles: see below
// (all runtime paths are `::workflow_core::__private::..`)
//
// The user sees the macro's errors and nothing more: callers keep type-checking against a
// function of that name and arity, with each argument and the result as declared where they
// can be named outside the user's generics (a borrow, `impl Trait` or generic parameter becomes
// a parameter of the stand-in, inferred from the call, so any value is accepted); a missing
// return type counts as the `Result<()>` the error asks for, and an unnameable result as
// `serde_json::Value`. The user's function sits inside, unchanged, so the IDE keeps working in
// its body and rustc still type-checks the body against the signature as written.
//
// At run time: a rejected workflow is never registered (there is no `inventory::submit!`), and
// its `Rejected` definition fails every call with an error, so it never runs; a rejected step
// panics when called. Either way this code only compiles when syn cannot parse a body that
// rustc can (syntax newer than syn); every other path here comes with an error of ours.
//
// A method (`self` receiver) is left as written: a stand-in would have to be another method, and
// any other item is not allowed inside an `impl`.
fn stand_in(kind: Kind, item: &syn::ItemFn, raw_body: Option<&proc_macro2::Group>) -> TokenStream {
    let body = match raw_body {
        Some(raw_body) => raw_body.to_token_stream(),
        None => crate::lift::body(&item.block).to_token_stream(),
    };
    let sig = &item.sig;
    let attrs = &item.attrs;
    let vis = &item.vis;
    if sig.receiver().is_some() {
        return quote!(#(#attrs)* #vis #sig #body);
    }

    let ident = &sig.ident;
    let lints = lint_attrs(attrs);
    let nested = quote! {
        #[allow(dead_code)]
        #(#lints)*
        #sig #body
    };
    let mut params = Vec::new();
    let mut names = Vec::new();
    let mut forwarded = Vec::new();
    let mut types = Vec::new();
    for (i, arg) in sig
        .inputs
        .iter()
        .filter_map(|input| match input {
            syn::FnArg::Typed(arg) => Some(arg),
            syn::FnArg::Receiver(_) => None,
        })
        .enumerate()
    {
        // As in `forwarded_args`: the user's name, used with the call-site span.
        let (name, use_of_name) = match &*arg.pat {
            syn::Pat::Ident(pat) if pat.by_ref.is_none() && pat.subpat.is_none() => {
                let mut use_of_name = pat.ident.clone();
                use_of_name.set_span(Span::call_site());
                (pat.ident.clone(), use_of_name)
            }
            _ => {
                let name = Ident::new(&format!("__wf_arg{i}"), Span::mixed_site());
                (name.clone(), name)
            }
        };
        let ty = if parse::nameable(&arg.ty, &sig.generics) {
            arg.ty.to_token_stream()
        } else {
            let param = Ident::new(&format!("__WfArg{i}"), Span::mixed_site());
            params.push(match kind {
                Kind::Workflow => quote!(#param: 'static),
                Kind::Step => quote!(#param),
            });
            param.into_token_stream()
        };
        names.push(name);
        forwarded.push(use_of_name);
        types.push(ty);
    }
    let declared = match &sig.output {
        syn::ReturnType::Type(_, ty) if parse::nameable(ty, &sig.generics) => Some(&**ty),
        _ => None,
    };
    let value = quote!(::workflow_core::__private::serde_json::Value);

    match kind {
        Kind::Workflow => {
            let output = match (&sig.output, declared) {
                (syn::ReturnType::Default, _) => quote!(()),
                (_, Some(ty)) => quote_spanned! {ty.span()=>
                    <#ty as ::workflow_core::__private::WorkflowReturn>::Ok
                },
                (_, None) => value,
            };
            quote! {
                #(#attrs)*
                #vis fn #ident<#(#params),*>(#(#names: #types),*)
                    -> ::workflow_core::__private::WorkflowCall<
                        ::workflow_core::__private::Rejected<(#(#types,)*), #output>,
                    >
                {
                    #nested
                    ::workflow_core::__private::WorkflowCall::new((#(#forwarded,)*))
                }
            }
        }
        Kind::Step => {
            let unused = if forwarded.is_empty() {
                TokenStream::new()
            } else {
                quote!(let _ = (#(#forwarded,)*);)
            };
            let output = match (&sig.output, declared) {
                (_, Some(ty)) => ty.to_token_stream(),
                (syn::ReturnType::Default, _) => {
                    quote!(::core::result::Result<(), ::workflow_core::Error>)
                }
                (_, None) => quote!(::core::result::Result<#value, ::workflow_core::Error>),
            };
            quote! {
                #(#attrs)*
                #vis async fn #ident<#(#params),*>(#(#names: #types),*) -> #output {
                    #nested
                    #unused
                    ::core::panic!("`#[step]` rejected this fn when it was compiled, so it cannot run")
                }
            }
        }
    }
}

/// The lint attributes (`allow`, `warn`, `deny`, `forbid`) among `attrs`, which must also apply
/// to the user's body wherever the generated code moves it. Not `expect`: the copy left on the
/// outer fn would then go unfulfilled.
fn lint_attrs(attrs: &[Attribute]) -> impl Iterator<Item = &Attribute> {
    attrs.iter().filter(|attr| {
        ["allow", "warn", "deny", "forbid"]
            .iter()
            .any(|lint| attr.path().is_ident(lint))
    })
}

// Input:
//     #[step(name = "billing.charge")]            (or `#[workflow(name = "..")]`)
// Output:
//     #[doc(hidden)] #[macro_export] #[allow(non_local_definitions)]
//     macro_rules! __step_named_billing_charge__1f0e3dad { () => {} }
//
// `#[macro_export]` puts the macro at the crate root whatever module it is written in, so a
// second step with the same explicit name anywhere in the crate fails to compile with E0428
// ("the name `__step_named_billing_charge__..` is defined multiple times"), pointing at both
// `name = ".."` literals. The hash of the exact name keeps `a.b` and `a_b` apart; the `#[cfg]`s
// keep alternatives (`#[cfg(unix)]` / `#[cfg(not(unix))]`) from clashing. Names are only
// checked within a crate; across crates the runtime rejects duplicates when it is built.
fn unique_name(kind: Kind, name: Option<&syn::LitStr>, cfgs: &[&Attribute]) -> TokenStream {
    let Some(name) = name else {
        return TokenStream::new();
    };
    let value = name.value();
    let readable: String = value
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let kind = match kind {
        Kind::Workflow => "workflow",
        Kind::Step => "step",
    };
    let marker = Ident::new(
        &format!("__{kind}_named_{readable}__{:08x}", fnv1a(&value)),
        name.span(),
    );
    // `non_local_definitions` warns about an exported macro defined inside a function (a step
    // in a test's body): the marker is exported only to be defined twice, never to be used.
    quote_spanned! {name.span()=>
        #(#cfgs)*
        #[doc(hidden)]
        #[macro_export]
        #[allow(non_local_definitions)]
        macro_rules! #marker {
            () => {};
        }
    }
}

/// 32-bit FNV-1a: a stable hash (unlike `DefaultHasher`, whose output may change between Rust
/// versions) to tell names apart in an identifier.
fn fnv1a(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

fn body_ident() -> Ident {
    Ident::new("__wf_body", Span::mixed_site())
}

/// `async fn __wf_body(<the user's arguments>) -> <the user's return type> <the user's block>`:
/// the user's code as written, `mut` and argument attributes included, its own `expr?`s made
/// `lift(expr)?` (see `lift`).
fn body_fn(function: &Function, attrs: &[&Attribute]) -> TokenStream {
    let sig = &function.item.sig;
    let body = body_ident();
    let inputs = &sig.inputs;
    let output = &sig.output;
    let block = crate::lift::body(&function.item.block);
    quote! {
        #(#attrs)*
        async fn #body(#inputs) #output #block
    }
}

/// `let _ = assert_value::<T>;` per argument type and for the result's `Ok` type, each spanned
/// at the user's type so an unserializable one is reported there, once: the generated code that
/// serializes these types selects a bound-free stand-in when the check fails.
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

/// `<R as WorkflowReturn>::Ok`, spanning the whole return type `R`: the compiler reports a type
/// from its first token's start to its last token's end.
fn ok_type(function: &Function) -> TokenStream {
    let ty = &function.output;
    let (first, last) = outer_spans(ty);
    let open = quote_spanned!(first=> <);
    let ok = Ident::new("Ok", last);
    quote_spanned! {first=>
        #open #ty as ::workflow_core::__private::WorkflowReturn>::#ok
    }
}

/// The spans of the first and last tokens of `tokens`.
fn outer_spans(tokens: impl ToTokens) -> (Span, Span) {
    let mut trees = tokens.into_token_stream().into_iter();
    let first = trees
        .next()
        .map_or_else(Span::call_site, |tree| tree.span());
    let last = trees.last().map_or(first, |tree| match tree {
        proc_macro2::TokenTree::Group(group) => group.span_close(),
        other => other.span(),
    });
    (first, last)
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

/// The argument types as a tuple type: `()`, `(A,)`, `(A, B)`, its parentheses spanning the
/// parameter list, so that anything reported about a workflow's `type Args = ..` points at the
/// user's signature.
fn args_type(function: &Function) -> TokenStream {
    let types = function.args.iter().map(|arg| &arg.ty);
    let mut tuple =
        proc_macro2::Group::new(proc_macro2::Delimiter::Parenthesis, quote!(#(#types,)*));
    tuple.set_span(function.item.sig.paren_token.span.join());
    tuple.into_token_stream()
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
