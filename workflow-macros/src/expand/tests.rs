//! Snapshots of what the macros generate, in process: each case is the source a user writes
//! (attribute included), expanded through the same entry points the compiler calls. The output
//! must parse as a Rust file (a body that does not parse, re-emitted as written, is shown as
//! `{ unparsed_body! { .. } }`); the snapshot holds it pretty-printed, preceded for error cases by
//! each error with the source it points at.

use proc_macro2::{Delimiter, Group, TokenStream, TokenTree};

use super::{expand as generate, expand_step, expand_workflow, step, workflow};
use crate::args::{StepArgs, WorkflowArgs};
use crate::parse::Kind;

/// Expands `source` (`#[workflow(..)]` or `#[step(..)]` followed by an item) and renders the
/// errors, if any, and the output.
fn expand(source: &str) -> String {
    let tokens: TokenStream = source.parse().expect("the test source must tokenize");
    let (kind, args, item) = split_attribute(tokens);
    let (_, errors) = match kind {
        Kind::Workflow => {
            generate::<WorkflowArgs>(kind, args.clone(), item.clone(), expand_workflow)
        }
        Kind::Step => generate::<StepArgs>(kind, args.clone(), item.clone(), expand_step),
    };
    let output = match kind {
        Kind::Workflow => workflow(args, item.clone()),
        Kind::Step => step(args, item.clone()),
    };
    let file = syn::parse2::<syn::File>(output.clone())
        .or_else(|_| syn::parse2::<syn::File>(mark_unparsed_body(&item, output.clone())))
        .unwrap_or_else(|error| panic!("the expansion is not valid Rust: {error}\n{output}"));
    let output = prettyplease::unparse(&file);
    match errors {
        None => output,
        Some(errors) => format!("{}// Output:\n{output}", render(source, errors)),
    }
}

/// `output` with the item's body, if it appears there as written, wrapped as
/// `{ unparsed_body! { .. } }`: a case whose body does not parse (the user is typing) expands to
/// that body's tokens as they are, which is Rust again once they are complete.
fn mark_unparsed_body(item: &TokenStream, output: TokenStream) -> TokenStream {
    fn mark(tokens: TokenStream, body: &std::ops::Range<usize>) -> TokenStream {
        tokens
            .into_iter()
            .map(|tree| match tree {
                TokenTree::Group(group) if group.span().byte_range() == *body => {
                    let tokens = group.stream();
                    let mut marked =
                        Group::new(Delimiter::Brace, quote::quote!(unparsed_body! { #tokens }));
                    marked.set_span(group.span());
                    TokenTree::Group(marked)
                }
                TokenTree::Group(group) => {
                    let mut marked = Group::new(group.delimiter(), mark(group.stream(), body));
                    marked.set_span(group.span());
                    TokenTree::Group(marked)
                }
                other => other,
            })
            .collect()
    }

    match item.clone().into_iter().last() {
        Some(TokenTree::Group(body)) => mark(output, &body.span().byte_range()),
        _ => output,
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
    step_with_a_timeout: r#"
#[step(timeout = "1m30s")]
async fn call_the_bank(account: String) -> Result<u64> {
    bank().balance(&account).await
}
"#,
    transactional_step: r#"
#[step(transactional, name = "ledger.debit", max_retries = 1)]
pub async fn debit(tx: &mut Tx<'_>, account: String, mut cents: i64) -> Result<i64> {
    cents = cents.abs();
    tx.sqlite(move |c| c.query_row("SELECT balance - ?1 FROM accounts WHERE id = ?2",
        params![cents, account], |r| r.get(0)))
}
"#,
    transactional_step_without_args: r#"
#[step(transactional)]
async fn touch(tx: &mut Tx<'_>) -> Result<()> {
    tx.sqlite(|c| c.execute_batch("UPDATE stats SET touched = touched + 1"))
}
"#,
    error_transactional_without_tx: r#"
#[step(transactional)]
async fn debit(account: String, cents: i64) -> Result<i64> {
    Ok(cents)
}
"#,
    error_tx_in_another_position: r#"
#[step(transactional)]
async fn debit(account: String, tx: &mut Tx<'_>, other: Option<Tx<'static>>) -> Result<i64> {
    Ok(0)
}
"#,
    error_tx_without_transactional: r#"
#[step]
async fn debit(tx: &mut Tx<'_>, cents: i64) -> Result<i64> {
    Ok(cents)
}
"#,
    error_stream_in_transactional_body: r#"
#[step(transactional)]
async fn debit(tx: &mut Tx<'_>, cents: i64) -> Result<i64> {
    workflow_core::stream::<i64>("progress").write(cents).await?;
    Ok(cents)
}
"#,
    error_transactional_with_a_value: r#"
#[step(transactional = true)]
async fn debit(tx: &mut Tx<'_>, cents: i64) -> Result<i64> {
    Ok(cents)
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
    Ok(OrderResult::accepted(order_id))
}
"#,
    workflow_with_queue: r#"
#[workflow(queue = "payments")]
async fn process_order(order_id: String) -> Result<OrderResult> {
    Ok(OrderResult::accepted(order_id))
}
"#,
    workflow_with_concurrent_steps: r#"
#[workflow]
async fn fan_out(order_ids: Vec<String>) -> Result<Vec<Receipt>> {
    let (stock, quote) = futures::try_join!(reserve(order_ids.clone()), price(order_ids.clone()))?;
    let reply = tokio::select! {
        biased;
        reply = ask_customer(quote) => reply?,
        _ = sleep(Duration::from_secs(3600)) => Reply::Timeout,
    };
    futures::future::try_join_all(order_ids.into_iter().map(|id| charge(id, stock))).await
}
"#,
    workflow_with_hook: r#"
#[workflow]
async fn process_order(order_id: String) -> Result<OrderResult> {
    let mut request = create_hook::<OrderRequest>(format!("order:{order_id}"));
    if let Some(conflict) = request.get_conflict().await {
        return Ok(OrderResult::Duplicate { run_id: conflict.run_id });
    }
    let OrderRequest { confirmed } = request.recv().await?;
    Ok(OrderResult::Processed { confirmed })
}
"#,
    workflow_with_opt_outs: r#"
#[workflow]
async fn process_order(order_id: String) -> Result<()> {
    #[workflow::allow(nondeterministic, reason = "log timing only")]
    let started = Instant::now();
    #[workflow::allow(nondeterministic)]
    tracing::info!(at = ?SystemTime::now(), "replaying {order_id}");
    #[workflow::allow(nondeterministic)]
    metrics::record(started.elapsed());
    let label = format!("{order_id}-{}", #[workflow::allow(nondeterministic)] std::process::id());
    log(label, #[workflow::allow(nondeterministic)] std::time::Instant::now()).await
}
"#,
    step_reading_the_clock: r#"
#[step]
async fn stamp(order_id: String) -> Result<String> {
    let at = std::time::SystemTime::now();
    let nonce: u64 = rand::random();
    Ok(format!("{order_id} {at:?} {nonce}"))
}
"#,
}

// What must be rejected, with the error at the offending token and the function re-emitted.
snapshot! {
    error_not_async: r#"
#[workflow]
pub fn process_order(order_id: String) -> Result<OrderResult> {
    Ok(OrderResult::accepted(order_id))
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
#[step(deadline = 30, billing::name = "x")]
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
    error_bad_queue: r#"
#[workflow(queue = payments, name = "a", queue = "")]
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
    error_wall_clock: r#"
#[workflow]
async fn stamp(order_id: String) -> Result<String> {
    let at = std::time::SystemTime::now();
    let started = Instant::now();
    let utc = chrono::Utc::now();
    Ok(format!("{order_id} {at:?} {started:?} {utc}"))
}
"#,
    error_aliases: r#"
#[workflow]
async fn stamp(order_id: String) -> Result<String> {
    use std::time::SystemTime as Clock;
    use std::{fs, thread::{self, sleep as nap}};
    use tokio::spawn;
    let at = Clock::now();
    let also = <Clock>::now();
    nap(Duration::from_secs(1));
    thread::spawn(|| ());
    spawn(async {});
    let config = fs::read_to_string("config.toml")?;
    Ok(format!("{order_id} {at:?} {also:?} {config}"))
}
"#,
    error_inside_closures_async_blocks_and_macros: r#"
#[workflow]
async fn stamp(order_id: String) -> Result<String> {
    let later = || std::time::Instant::now();
    let task = async move { rand::random::<u64>() };
    println!("{order_id} at {:?}", std::time::SystemTime::now());
    let (a, b) = futures::join!(task, async { tokio::time::sleep(Duration::from_secs(1)).await });
    tracing::info!(region = ?std::env::var("REGION"), "started");
    fn helper() -> SystemTime {
        SystemTime::now()
    }
    Ok(format!("{a} {b:?} {:?}", later()))
}
"#,
    error_unbiased_select: r#"
#[workflow]
async fn first_reply(order_id: String) -> Result<String> {
    let a = tokio::select! {
        reply = ask_customer(order_id.clone()) => reply?,
        _ = sleep(Duration::from_secs(3600)) => String::new(),
    };
    let b = futures::select! {
        reply = ask_customer(order_id).fuse() => reply?,
        complete => String::new(),
    };
    Ok(a + &b)
}
"#,
    error_hash_map_iteration: r#"
#[workflow]
async fn charge_all(orders: Vec<(String, u64)>, limits: HashMap<String, u64>) -> Result<u64> {
    let mut by_customer = HashMap::new();
    for (customer, cents) in orders {
        *by_customer.entry(customer).or_insert(0) += cents;
    }
    let mut total = 0;
    for (customer, cents) in &by_customer {
        total += charge(customer.clone(), *cents).await?;
    }
    let names: Vec<_> = limits.keys().cloned().collect();
    let sum: u64 = by_customer.values().sum();
    Ok(total + sum + names.len() as u64)
}
"#,
    error_opt_out_misuse: r#"
#[workflow]
async fn stamp(order_id: String) -> Result<String> {
    #[workflow::allow]
    let a = SystemTime::now();
    #[workflow::allow(random)]
    let b = SystemTime::now();
    #[workflow::alow(nondeterministic)]
    let c = SystemTime::now();
    #[workflow::allow(nondeterministic)]
    fn helper() {}
    Ok(format!("{order_id} {a:?} {b:?} {c:?}"))
}
"#,
    error_opt_out_on_the_function: r#"
#[workflow]
#[workflow::allow(nondeterministic)]
async fn stamp(order_id: String) -> Result<String> {
    Ok(format!("{order_id} {:?}", SystemTime::now()))
}
"#,
    error_opt_out_in_step: r#"
#[step]
async fn stamp(order_id: String) -> Result<String> {
    #[workflow::allow(nondeterministic)]
    let at = SystemTime::now();
    Ok(format!("{order_id} {at:?}"))
}
"#,
    error_body_and_signature_at_once: r#"
#[workflow]
async fn stamp(order_id: &str) -> Result<String> {
    let at = SystemTime::now();
    #[workflow::allow(nondeterministic)]
    let started = Instant::now();
    Ok(format!("{order_id} {at:?} {started:?}"))
}
"#,
    error_several_at_once: r#"
#[workflow(nam = "orders", name = "")]
fn process_order<T>(self, order: &Order, (a, b): (u32, u32), items: impl Iterator<Item = T>) {
    let _ = (order, a, b, items.count());
}
"#,
}

// What stands in for a rejected function, so that its callers add no error of their own.
snapshot! {
    error_stand_in_arguments: r#"
#[workflow]
pub fn process<T: Item>(
    order: &Order,
    id: String,
    (a, b): (u32, u32),
    items: Vec<T>,
    notify: impl Fn(&str),
    on_done: fn(&str),
) -> Result<Vec<T>> {
    Ok(items)
}
"#,
    error_stand_in_step: r#"
#[step(max_retries = 2)]
#[allow(unused_variables)]
/// Logs the event.
pub(crate) fn log_event<'a>(event: Cow<'a, str>, _level: u8, mut count: u32) {
    println!("{event}");
}
"#,
    error_stand_in_unnameable_result: r#"
#[workflow]
async fn lookup(key: String) -> Result<&'static str> {
    Ok("x")
}
"#,
    unparsed_workflow_body: r#"
#[workflow]
pub async fn process_order(order_id: String, qty: u32) -> Result<u64> {
    let total = charge(order_id, qty).
    Ok(total)
}
"#,
    unparsed_step_body: r#"
#[step]
async fn charge(order_id: String, qty: u32) -> Result<u64> {
    #[workflow::allow(nondeterministic)]
    let at = SystemTime::now();
    let price = match qty { 0 => , _ => 100 };
    Ok(price)
}
"#,
}

/// Every rule's example in one workflow: one error each, in order, each message in full.
#[test]
fn error_every_rule() {
    let mut source = String::from("\n#[workflow]\nasync fn every_rule() -> Result<()> {\n");
    for rule in crate::rules::RULES {
        source += &format!("    {}\n", rule.example);
    }
    source += "    Ok(())\n}\n";
    insta::assert_snapshot!(expand(&source));
}
