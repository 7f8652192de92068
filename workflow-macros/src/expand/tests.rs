//! Snapshots of what the macros generate, in process: each case is the source a user writes
//! (attribute included), expanded through the same entry points the compiler calls. The output
//! must parse as a Rust file; the snapshot holds it pretty-printed, preceded for error cases by
//! each error with the source it points at.

use proc_macro2::{TokenStream, TokenTree};

use super::{parse_all, step, workflow};
use crate::args::{StepArgs, WorkflowArgs};
use crate::parse::Kind;

/// Expands `source` (`#[workflow(..)]` or `#[step(..)]` followed by an item) and renders the
/// errors, if any, and the output.
fn expand(source: &str) -> String {
    let tokens: TokenStream = source.parse().expect("the test source must tokenize");
    let (kind, args, item) = split_attribute(tokens);
    let errors = match kind {
        Kind::Workflow => parse_all::<WorkflowArgs>(kind, args.clone(), item.clone()).err(),
        Kind::Step => parse_all::<StepArgs>(kind, args.clone(), item.clone()).err(),
    };
    let output = match kind {
        Kind::Workflow => workflow(args, item),
        Kind::Step => step(args, item),
    };
    let file = syn::parse2::<syn::File>(output.clone())
        .unwrap_or_else(|error| panic!("the expansion is not valid Rust: {error}\n{output}"));
    let output = prettyplease::unparse(&file);
    match errors {
        None => output,
        Some(errors) => format!("{}// Output:\n{output}", render(source, errors)),
    }
}

/// What the compiler hands the macro: the attribute's arguments and the item after it.
fn split_attribute(tokens: TokenStream) -> (Kind, TokenStream, TokenStream) {
    let mut tokens = tokens.into_iter();
    let (Some(TokenTree::Punct(pound)), Some(TokenTree::Group(attribute))) =
        (tokens.next(), tokens.next())
    else {
        panic!("the test source must start with the attribute");
    };
    assert_eq!(pound.as_char(), '#');
    let mut attribute = attribute.stream().into_iter();
    let kind = match attribute.next() {
        Some(TokenTree::Ident(ident)) if ident == "workflow" => Kind::Workflow,
        Some(TokenTree::Ident(ident)) if ident == "step" => Kind::Step,
        other => panic!("expected `workflow` or `step`, found {other:?}"),
    };
    let args = match attribute.next() {
        Some(TokenTree::Group(args)) => args.stream(),
        None => TokenStream::new(),
        other => panic!("expected `(options)`, found {other:?}"),
    };
    (kind, args, tokens.collect())
}

/// Each error as `error: message` over the source line it points at, rustc style.
fn render(source: &str, errors: syn::Error) -> String {
    let mut rendered = String::new();
    for error in errors {
        // `to_compile_error` puts the start span on the leading `::` and the end span on the
        // closing `{ .. }`, which is how rustc sees the whole range too.
        let tokens: Vec<TokenTree> = error.to_compile_error().into_iter().collect();
        let start = tokens.first().expect("a compile_error! invocation").span();
        let end = tokens.last().expect("a compile_error! invocation").span();
        rendered += &format!("error: {error}\n");
        if start.byte_range() == (0..0) {
            rendered += "  --> at the attribute\n\n";
            continue;
        }
        let (start, end) = (start.start(), end.end());
        let text = source
            .lines()
            .nth(start.line - 1)
            .expect("the error's line");
        let width = if end.line == start.line {
            end.column - start.column
        } else {
            text.chars().count() - start.column
        };
        rendered += &format!(
            "  --> {}:{}\n   |\n{:>2} | {text}\n   | {}{}\n\n",
            start.line,
            start.column + 1,
            start.line,
            " ".repeat(start.column),
            "^".repeat(width.max(1)),
        );
    }
    rendered
}

macro_rules! snapshot {
    ($($name:ident: $source:literal,)*) => {
        $(
            #[test]
            fn $name() {
                insta::assert_snapshot!(expand($source));
            }
        )*
    };
}

// What must expand.
snapshot! {
    step_without_args: r#"
#[step]
async fn ping() -> Result<()> {
    Ok(())
}
"#,
    step_with_args_and_options: r#"
#[step(name = "billing.charge", max_retries = 5)]
/// Charges the user once per step invocation.
pub async fn charge_user(user_id: String, amount: u64) -> Result<Receipt> {
    let StepMetadata { step_id, .. } = step_metadata();
    let receipt = payments().charge(&user_id, amount, &step_id).await?;
    Ok(receipt)
}
"#,
    step_with_one_mut_arg: r#"
#[step(max_retries = 0)]
pub(crate) async fn bump(mut counter: u32) -> Result<u32> {
    counter += 1;
    Ok(counter)
}
"#,
    step_with_cfg_and_raw_name: r#"
#[step]
#[cfg(feature = "billing")]
async fn r#type(kind: workflow_core::Json<Kind>) -> Result<Vec<u8>> {
    Ok(kind.0.encode())
}
"#,
    workflow_without_args: r#"
#[workflow]
async fn nightly_report() -> Result<()> {
    Ok(())
}
"#,
    workflow_with_one_arg: r#"
#[workflow]
pub async fn process_order(order_id: String) -> Result<OrderResult> {
    let receipt = charge_user(order_id.clone(), 1000).await?;
    sleep(Duration::from_secs(3600)).await;
    Ok(OrderResult::Processed { receipt })
}
"#,
    workflow_with_several_args: r#"
#[workflow]
/// Ships an order.
#[allow(clippy::too_many_lines)]
#[must_use]
pub(crate) async fn ship(order_id: String, mut qty: u32, address: Address) -> Result<Shipment> {
    qty = qty.max(1);
    book_courier(order_id, qty, address).await
}
"#,
    workflow_with_name: r#"
#[workflow(name = "orders.process")]
async fn process_order(order_id: String) -> Result<OrderResult> {
    todo!()
}
"#,
}

// What must be rejected, with the error at the offending token and the function re-emitted.
snapshot! {
    error_not_async: r#"
#[workflow]
pub fn process_order(order_id: String) -> Result<OrderResult> {
    todo!()
}
"#,
    error_step_not_async_const_unsafe_extern: r#"
#[step]
const unsafe extern "C" fn ping() -> Result<()> {
    Ok(())
}
"#,
    error_self_receiver: r#"
#[step]
async fn charge(&self, amount: u64) -> Result<Receipt> {
    self.client.charge(amount).await
}
"#,
    error_generics: r#"
#[workflow]
async fn process<T: Order, 'a>(order: T) -> Result<()> where T: Send {
    Ok(())
}
"#,
    error_where_clause_only: r#"
#[step]
async fn ping() -> Result<()> where String: Clone {
    Ok(())
}
"#,
    error_reference_args: r#"
#[step]
async fn charge(user_id: &str, data: &'static [u8], order: Option<&mut Order>) -> Result<()> {
    Ok(())
}
"#,
    error_borrowing_lifetime: r#"
#[step]
async fn greet(name: Cow<'_, str>) -> Result<Cow<'static, str>> {
    Ok(name.into_owned().into())
}
"#,
    error_impl_trait_arg: r#"
#[workflow]
async fn notify(message: impl Into<String>, channels: Vec<impl Channel>) -> Result<()> {
    Ok(())
}
"#,
    error_pattern_args: r#"
#[step]
async fn add((a, b): (u32, u32), _: u32, ref c: u32, d @ 1..=9: u32) -> Result<u32> {
    Ok(a + b)
}
"#,
    error_cfg_on_arg: r#"
#[step]
async fn charge(#[cfg(feature = "tips")] tip: u64, #[allow(unused)] amount: u64) -> Result<()> {
    Ok(())
}
"#,
    error_missing_return_type: r#"
#[step]
async fn log_event(event: String) {
    println!("{event}");
}
"#,
    error_borrowed_or_impl_result: r#"
#[step]
async fn lookup(key: String) -> Result<&'static str> {
    Ok("x")
}
"#,
    error_unknown_option_with_suggestion: r#"
#[step(max_retry = 5, nmae = "billing.charge")]
async fn charge(amount: u64) -> Result<()> {
    Ok(())
}
"#,
    error_unknown_option_without_suggestion: r#"
#[step(timeout = 30, billing::name = "x")]
async fn charge(amount: u64) -> Result<()> {
    Ok(())
}
"#,
    error_workflow_max_retries: r#"
#[workflow(max_retries = 2)]
async fn process_order(order_id: String) -> Result<()> {
    Ok(())
}
"#,
    error_duplicate_option: r#"
#[step(name = "a", max_retries = 1, name = "b")]
async fn charge(amount: u64) -> Result<()> {
    Ok(())
}
"#,
    error_bad_option_values: r#"
#[step(name = "", max_retries = -1)]
async fn charge(amount: u64) -> Result<()> {
    Ok(())
}
"#,
    error_bad_option_values_2: r#"
#[step(name = NAME, max_retries = 5000000000)]
async fn charge(amount: u64) -> Result<()> {
    Ok(())
}
"#,
    error_option_suffix_and_shape: r#"
#[step(max_retries = 5u8, name("x"))]
async fn charge(amount: u64) -> Result<()> {
    Ok(())
}
"#,
    error_option_syntax: r#"
#[workflow(name: "orders")]
async fn process_order() -> Result<()> {
    Ok(())
}
"#,
    error_not_a_function: r#"
#[step]
struct Charge {
    amount: u64,
}
"#,
    error_several_at_once: r#"
#[workflow(nam = "orders", name = "")]
fn process_order<T>(self, order: &Order, (a, b): (u32, u32), items: impl Iterator<Item = T>) {
    todo!()
}
"#,
}
