//! The attribute's options: `#[workflow(name = "..")]` and
//! `#[step(name = "..", max_retries = 5)]`. Parsing never stops at the first bad option: each
//! unknown, repeated or ill-typed option gets its own spanned error, so the user fixes them all in
//! one compile.

use std::fmt::Write as _;

use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Expr, Ident, Lit, LitInt, LitStr, Meta, Token};

use crate::errors::Errors;

/// Options of `#[workflow]`.
#[derive(Default)]
pub(crate) struct WorkflowArgs {
    /// Pins the workflow's stable name; default: module path + fn name.
    pub(crate) name: Option<LitStr>,
    /// The queue its runs enter by default; default none.
    pub(crate) queue: Option<LitStr>,
}

/// Options of `#[step]`.
#[derive(Default)]
pub(crate) struct StepArgs {
    /// Pins the step's stable name; default: module path + fn name.
    pub(crate) name: Option<LitStr>,
    /// Unsuffixed, checked to fit a `u32`; default [`DEFAULT_MAX_RETRIES`].
    pub(crate) max_retries: Option<LitInt>,
    /// Each attempt's deadline, in milliseconds, from `timeout = "30s"`; default none.
    pub(crate) timeout_ms: Option<u64>,
    /// `transactional`: the first parameter is the store's transaction (`&mut Tx<'_>`), in
    /// which the step's writes commit with its recorded result.
    pub(crate) transactional: bool,
}

/// Retries after the first attempt, so at most four attempts, as documented.
pub(crate) const DEFAULT_MAX_RETRIES: u32 = 3;

const WORKFLOW_OPTIONS: &[&str] = &["name", "queue"];
const STEP_OPTIONS: &[&str] = &["name", "max_retries", "timeout", "transactional"];
/// Options written as a bare word, without a value.
const FLAGS: &[&str] = &["transactional"];

impl Parse for WorkflowArgs {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut errors = Errors::default();
        let mut args = WorkflowArgs::default();
        for (key, value) in options(input, "workflow", WORKFLOW_OPTIONS, &mut errors)? {
            if key == "queue" {
                args.queue = queue(&value, &mut errors);
            } else {
                args.name = name(&value, "workflow", &mut errors);
            }
        }
        errors.finish(args)
    }
}

impl Parse for StepArgs {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut errors = Errors::default();
        let mut args = StepArgs::default();
        for (key, value) in options(input, "step", STEP_OPTIONS, &mut errors)? {
            if key == "name" {
                args.name = name(&value, "step", &mut errors);
            } else if key == "transactional" {
                args.transactional = true;
            } else if key == "timeout" {
                args.timeout_ms = timeout(&value, &mut errors);
            } else {
                args.max_retries = max_retries(&value, &mut errors);
            }
        }
        errors.finish(args)
    }
}

/// The `key = value` options whose key is known and given once; every other option becomes an
/// error in `errors`. Only a syntax error (not a comma-separated list of options) is returned
/// directly, since nothing after it can be read.
fn options(
    input: ParseStream,
    macro_name: &str,
    known: &[&str],
    errors: &mut Errors,
) -> syn::Result<Vec<(Ident, Expr)>> {
    let metas = Punctuated::<Meta, Token![,]>::parse_terminated(input)?;
    let mut accepted: Vec<(Ident, Expr)> = Vec::new();
    for meta in metas {
        let Some(key) = meta.path().get_ident().cloned() else {
            let path = meta.path();
            let shown = quote::quote!(#path).to_string().replace(' ', "");
            errors.spanned(path, unknown_option(&shown, macro_name, known));
            continue;
        };
        let key_text = key.to_string();
        if !known.contains(&key_text.as_str()) {
            errors.at(key.span(), unknown_option(&key_text, macro_name, known));
            continue;
        }
        if accepted.iter().any(|(seen, _)| *seen == key) {
            errors.at(
                key.span(),
                format_args!("duplicate option `{key}`: it may be given only once; remove one"),
            );
            continue;
        }
        match meta {
            Meta::Path(_) if FLAGS.contains(&key_text.as_str()) => {
                accepted.push((key, Expr::Verbatim(proc_macro2::TokenStream::new())));
            }
            other if FLAGS.contains(&key_text.as_str()) => errors.spanned(
                other,
                format_args!("`{key}` takes no value: write `#[{macro_name}({key})]`"),
            ),
            Meta::NameValue(option) => accepted.push((key, option.value)),
            other => errors.spanned(
                other,
                format_args!("expected `{key} = {}`", example(&key_text)),
            ),
        }
    }
    Ok(accepted)
}

fn unknown_option(option: &str, macro_name: &str, known: &[&str]) -> String {
    let mut message = format!("unknown option `{option}` for `#[{macro_name}]`: ");
    if macro_name == "workflow" && option == "max_retries" {
        message.push_str(
            "workflows are not retried, their steps are; set `max_retries` on the `#[step]`",
        );
        return message;
    }
    match suggestion(option, known) {
        Some(suggestion) => {
            let _ = write!(message, "did you mean `{suggestion}`?");
        }
        None => {
            message.push_str("expected ");
            for (i, candidate) in known.iter().enumerate() {
                if i > 0 {
                    message.push_str(if i + 1 == known.len() { " or " } else { ", " });
                }
                if FLAGS.contains(candidate) {
                    let _ = write!(message, "`{candidate}`");
                } else {
                    let _ = write!(message, "`{candidate} = {}`", example(candidate));
                }
            }
        }
    }
    message
}

/// The known option `option` is most likely a typo of: within two edits (a third one allowed per
/// three characters beyond, as rustc does, so `max_retry` finds `max_retries`), or one
/// containing the other (`retries`).
fn suggestion<'a>(option: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|candidate| (edit_distance(option, candidate), *candidate))
        .filter(|(distance, candidate)| {
            *distance <= (candidate.len() / 3).max(2)
                || (option.len() >= 4 && (candidate.contains(option) || option.contains(candidate)))
        })
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

fn example(option: &str) -> &'static str {
    match option {
        "max_retries" => "5",
        "timeout" => "\"30s\"",
        "queue" => "\"payments\"",
        _ => "\"billing.charge\"",
    }
}

fn name(value: &Expr, macro_name: &str, errors: &mut Errors) -> Option<LitStr> {
    match literal(value) {
        Some(Lit::Str(name)) if name.value().is_empty() => {
            errors.spanned(
                name,
                format_args!(
                    "`name` must not be empty: it is the {macro_name}'s identity in every \
                     recorded history; omit `name` to use the module path and fn name"
                ),
            );
            None
        }
        Some(Lit::Str(name)) => Some(name.clone()),
        _ => {
            errors.spanned(
                value,
                "`name` takes a string literal, e.g. `name = \"billing.charge\"`",
            );
            None
        }
    }
}

fn queue(value: &Expr, errors: &mut Errors) -> Option<LitStr> {
    match literal(value) {
        Some(Lit::Str(queue)) if queue.value().is_empty() => {
            errors.spanned(
                queue,
                "`queue` must not be empty: it names a queue declared with \
                 `Runtime::builder().queue(Queue::new(\"..\"))`",
            );
            None
        }
        Some(Lit::Str(queue)) => Some(queue.clone()),
        _ => {
            errors.spanned(
                value,
                "`queue` takes a string literal naming a queue declared on the runtime \
                 builder, e.g. `queue = \"payments\"`",
            );
            None
        }
    }
}

fn max_retries(value: &Expr, errors: &mut Errors) -> Option<LitInt> {
    let Some(Lit::Int(retries)) = literal(value) else {
        errors.spanned(
            value,
            "`max_retries` takes an integer literal, e.g. `max_retries = 5`",
        );
        return None;
    };
    if !matches!(retries.suffix(), "" | "u32") {
        errors.spanned(
            retries,
            format_args!(
                "`max_retries` is a `u32`, not a `{}`: drop the suffix",
                retries.suffix()
            ),
        );
        return None;
    }
    match retries.base10_parse::<u32>() {
        Ok(count) => Some(LitInt::new(&count.to_string(), retries.span())),
        Err(_) => {
            errors.spanned(
                retries,
                format_args!("`max_retries` is a `u32`: from 0 to {}", u32::MAX),
            );
            None
        }
    }
}

fn timeout(value: &Expr, errors: &mut Errors) -> Option<u64> {
    let Some(Lit::Str(text)) = literal(value) else {
        errors.spanned(
            value,
            "`timeout` takes a duration string, e.g. `timeout = \"30s\"` (units: ms, s, m, h, d)",
        );
        return None;
    };
    match parse_duration_ms(&text.value()) {
        Ok(0) => {
            errors.spanned(text, "`timeout` must be longer than zero");
            None
        }
        Ok(ms) => Some(ms),
        Err(why) => {
            errors.spanned(
                text,
                format_args!(
                    "`timeout = {:?}`: {why}; write a number and a unit, e.g. \"500ms\", \"30s\", \
                     \"5m\", \"1h\" or \"1m30s\"",
                    text.value()
                ),
            );
            None
        }
    }
}

/// A duration in jiff's friendly format (`"500ms"`, `"30s"`, `"5m"`, `"1h30m"`, `"2 hours"`,
/// `"1d"`; units from largest to smallest, each once) or ISO 8601 (`"PT30S"`), as
/// milliseconds. Days and weeks are 24 hours and 7 days; months and years, whose length
/// depends on the date, are refused, as are negative durations. `workflow prune
/// --older-than` reads the same grammar with the same rules.
pub(crate) fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return Err("a unit is missing".into());
    }
    let span: jiff::Span = text.parse().map_err(|e: jiff::Error| {
        let e = e.to_string();
        // jiff's reason without its preamble, which names a format the user did not choose.
        match e.split_once("duration format: ") {
            Some((_, reason)) => reason.to_owned(),
            None => e,
        }
    })?;
    if span.is_negative() {
        return Err("a timeout cannot be negative".into());
    }
    if span.get_years() != 0 || span.get_months() != 0 {
        return Err("months and years have no fixed length; use days (`30d`) or weeks".into());
    }
    let duration = span
        .to_duration(jiff::SpanRelativeTo::days_are_24_hours())
        .map_err(|_| "the duration is too long".to_string())?;
    u64::try_from(duration.as_millis()).map_err(|_| "the duration is too long".to_string())
}

/// The literal in `value`, looking through the invisible group a `macro_rules!` fragment
/// (`$name:expr`) arrives in.
fn literal(value: &Expr) -> Option<&Lit> {
    match value {
        Expr::Lit(lit) if lit.attrs.is_empty() => Some(&lit.lit),
        Expr::Group(group) => literal(&group.expr),
        _ => None,
    }
}

/// Levenshtein distance, for "did you mean" suggestions; options are short, so the quadratic
/// table is fine.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, a_char) in a.chars().enumerate() {
        let mut current = vec![i + 1; b.len() + 1];
        for (j, b_char) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(a_char != *b_char);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        previous = current;
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::{edit_distance, parse_duration_ms, suggestion, STEP_OPTIONS, WORKFLOW_OPTIONS};

    #[test]
    fn edit_distance_counts_single_character_edits() {
        assert_eq!(edit_distance("max_retries", "max_retries"), 0);
        assert_eq!(edit_distance("max_retires", "max_retries"), 2);
        assert_eq!(edit_distance("max_retry", "max_retries"), 3);
        assert_eq!(edit_distance("nmae", "name"), 2);
        assert_eq!(edit_distance("", "name"), 4);
        assert_eq!(edit_distance("timeout", "name"), 5);
    }

    #[test]
    fn reads_durations() {
        assert_eq!(parse_duration_ms("30s"), Ok(30_000));
        assert_eq!(parse_duration_ms("1m30s"), Ok(90_000));
        assert_eq!(parse_duration_ms("1m 30s"), Ok(90_000));
        assert_eq!(parse_duration_ms("1h"), Ok(3_600_000));
        assert_eq!(parse_duration_ms("250ms"), Ok(250));
        assert_eq!(parse_duration_ms("30 seconds"), Ok(30_000));
        assert_eq!(parse_duration_ms("1.5h"), Ok(5_400_000));
        assert_eq!(parse_duration_ms("2d"), Ok(172_800_000));
        assert_eq!(parse_duration_ms("PT30S"), Ok(30_000));
        assert_eq!(parse_duration_ms("0s"), Ok(0));
        assert_eq!(parse_duration_ms("30"), Err("a unit is missing".to_owned()));
        for bad in [
            "",
            "s",
            "1s1m",
            "30 parsecs",
            "-5s",
            "5s ago",
            "1mo",
            "1y",
            "99999999999999999999h",
        ] {
            assert!(parse_duration_ms(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_duration_ms("1s1m"),
            Err(
                "found value with unit minute after unit second, but units must be written \
                 from largest to smallest (and they can't be repeated)"
                    .to_owned()
            )
        );
    }

    #[test]
    fn suggests_only_near_misses() {
        for typo in [
            "max_retires",
            "max_retry",
            "max_retrys",
            "maxretries",
            "retries",
        ] {
            assert_eq!(
                suggestion(typo, STEP_OPTIONS),
                Some("max_retries"),
                "{typo}"
            );
        }
        for typo in ["nmae", "Name", "names"] {
            assert_eq!(suggestion(typo, STEP_OPTIONS), Some("name"), "{typo}");
        }
        for unrelated in ["deadline", "id", "retry_delay", "x"] {
            assert_eq!(suggestion(unrelated, STEP_OPTIONS), None, "{unrelated}");
        }
        assert_eq!(suggestion("max_retries", WORKFLOW_OPTIONS), None);
    }
}
