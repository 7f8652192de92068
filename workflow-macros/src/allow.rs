//! The opt-out: `#[workflow::allow(nondeterministic)]` on a statement or expression inside a
//! `#[workflow]` body lets the determinism scan accept what is inside it.
//!
//! It is our own syntax, not a real attribute: the compiler never resolves it, because the
//! `#[workflow]` macro sees the body first and removes it. That is also why it must be removed
//! everywhere (inside closures and nested items too, and from `#[step]` bodies, where it is an
//! error): left in place, rustc would reject it as an unknown attribute, or as an attribute on an
//! expression, which is unstable. On a statement the macro puts
//! `#[allow(clippy::disallowed_methods)]` in its place, so the second line of defence (clippy's
//! `disallowed_methods`, see `docs/diagnostics.md`) accepts the same statement.

use proc_macro2::{Delimiter, Group, Span, TokenStream, TokenTree};
use syn::parse::{Parse, ParseStream, Parser};
use syn::spanned::Spanned;
use syn::visit_mut::{self, VisitMut};
use syn::{Attribute, Expr, Ident, LitStr, Stmt, Token};

use crate::errors::Errors;
use crate::parse::Kind;

/// Whether `attr` is ours: any `#[workflow::..]` attribute inside a body (a misspelled one too,
/// so it is reported rather than left for rustc to choke on).
pub(crate) fn is_ours(attr: &Attribute) -> bool {
    let mut segments = attr.path().segments.iter();
    attr.path().leading_colon.is_none()
        && segments
            .next()
            .is_some_and(|first| first.ident == "workflow")
        && segments.next().is_some()
}

/// Whether `attr` is a well-formed opt-out (those that are not are reported by [`strip`]).
pub(crate) fn is_opt_out(attr: &Attribute) -> bool {
    is_ours(attr) && attr.path().segments.len() == 2 && attr.path().segments[1].ident == "allow"
}

/// `nondeterministic` with an optional `, reason = ".."`, which documents the exception for the
/// reader and is otherwise ignored.
struct OptOut;

impl Parse for OptOut {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let what: Ident = input.parse()?;
        if what != "nondeterministic" {
            return Err(syn::Error::new(
                what.span(),
                format_args!(
                    "unknown opt-out `{what}`: the only one is \
                     `#[workflow::allow(nondeterministic)]`"
                ),
            ));
        }
        if input.parse::<Option<Token![,]>>()?.is_some() && !input.is_empty() {
            let key: Ident = input.parse()?;
            if key != "reason" {
                return Err(syn::Error::new(
                    key.span(),
                    format_args!(
                        "unknown option `{key}`: expected \
                         `#[workflow::allow(nondeterministic, reason = \"..\")]`"
                    ),
                ));
            }
            input.parse::<Token![=]>()?;
            input.parse::<LitStr>()?;
            input.parse::<Option<Token![,]>>()?;
        }
        Ok(OptOut)
    }
}

/// Removes every `#[workflow::..]` attribute from `function`, reporting the malformed ones,
/// those on the function itself, and, in a `#[step]` (which is not scanned), every one.
pub(crate) fn strip(kind: Kind, function: &mut syn::ItemFn, errors: &mut Errors) {
    let mut stripper = Stripper { kind, errors };
    if let Some(span) = stripper.take(&mut function.attrs) {
        if let Kind::Workflow = kind {
            stripper.errors.push(syn::Error::new(
                span,
                "`#[workflow::allow(nondeterministic)]` goes on a statement or an expression \
                 inside the body, the smallest one that needs it: a whole workflow cannot opt out",
            ));
        }
    }
    stripper.visit_block_mut(&mut function.block);
}

/// Removes every `#[workflow::..]` attribute from a body that does not parse (kept as tokens
/// for the stand-in), reporting the malformed ones and, in a `#[step]`, every one.
pub(crate) fn strip_raw(kind: Kind, body: &Group, errors: &mut Errors) -> Group {
    let mut stripper = Stripper { kind, errors };
    let mut stripped = Group::new(body.delimiter(), stripper.strip_tokens(body.stream()));
    stripped.set_span(body.span());
    stripped
}

struct Stripper<'e> {
    kind: Kind,
    errors: &'e mut Errors,
}

impl Stripper<'_> {
    /// Removes our attributes from `attrs`; returns the span of the last opt-out removed.
    fn take(&mut self, attrs: &mut Vec<Attribute>) -> Option<Span> {
        let mut removed = None;
        attrs.retain(|attr| {
            if !is_ours(attr) {
                return true;
            }
            self.check(attr);
            removed = Some(attr.span());
            false
        });
        removed
    }

    fn check(&mut self, attr: &Attribute) {
        if !is_opt_out(attr) {
            let path = attr.path();
            self.errors.spanned(
                path,
                format_args!(
                    "unknown attribute `{}`: the opt-out is \
                     `#[workflow::allow(nondeterministic)]`",
                    crate::parse::tidy(&quote::quote!(#path).to_string())
                ),
            );
            return;
        }
        if let Err(error) = attr.parse_args::<OptOut>() {
            let shown = match attr.meta {
                syn::Meta::Path(_) => {
                    syn::Error::new_spanned(attr, "expected `#[workflow::allow(nondeterministic)]`")
                }
                _ => error,
            };
            self.errors.push(shown);
            return;
        }
        if let Kind::Step = self.kind {
            self.errors.spanned(
                attr,
                "`#[workflow::allow(nondeterministic)]` is for `#[workflow]` bodies only: a \
                 `#[step]` may read the clock or do I/O, its result is recorded; remove it",
            );
        }
    }
}

impl Stripper<'_> {
    /// `tokens` without any `#[workflow::..]`, at any depth.
    fn strip_tokens(&mut self, tokens: TokenStream) -> TokenStream {
        let mut kept = TokenStream::new();
        let mut trees = tokens.into_iter().peekable();
        while let Some(tree) = trees.next() {
            match tree {
                TokenTree::Punct(pound) if pound.as_char() == '#' => {
                    if let Some(TokenTree::Group(group)) = trees.peek() {
                        if group.delimiter() == Delimiter::Bracket {
                            let attribute = quote::quote!(#pound #group);
                            if let Ok(attrs) = Attribute::parse_outer.parse2(attribute) {
                                if attrs.len() == 1 && is_ours(&attrs[0]) {
                                    self.check(&attrs[0]);
                                    trees.next();
                                    continue;
                                }
                            }
                        }
                    }
                    kept.extend([TokenTree::Punct(pound)]);
                }
                TokenTree::Group(group) => {
                    let mut stripped =
                        Group::new(group.delimiter(), self.strip_tokens(group.stream()));
                    stripped.set_span(group.span());
                    kept.extend([TokenTree::Group(stripped)]);
                }
                other => kept.extend([other]),
            }
        }
        kept
    }
}

/// The lint attribute left in place of an opt-out on a statement.
fn clippy_allow(span: Span) -> Attribute {
    syn::parse_quote_spanned!(span=> #[allow(clippy::disallowed_methods)])
}

/// Expression statements that take an outer attribute on stable Rust: those the parser does not
/// hand the attribute to a sub-expression of (`#[a] x + y;` puts it on `x`, which is unstable).
fn statement_takes_attributes(expr: &Expr) -> bool {
    matches!(
        expr,
        Expr::Call(_)
            | Expr::MethodCall(_)
            | Expr::Await(_)
            | Expr::Block(_)
            | Expr::Unsafe(_)
            | Expr::If(_)
            | Expr::Match(_)
            | Expr::Loop(_)
            | Expr::While(_)
            | Expr::ForLoop(_)
    )
}

impl VisitMut for Stripper<'_> {
    fn visit_stmt_mut(&mut self, stmt: &mut Stmt) {
        let (attrs, takes_lint) = match stmt {
            Stmt::Local(local) => (&mut local.attrs, true),
            // rustc ignores (and warns about) a lint attribute on a macro invocation.
            Stmt::Macro(mac) => (&mut mac.attrs, false),
            Stmt::Expr(expr, _) => {
                let takes = statement_takes_attributes(expr);
                match crate::analyze::expr_attrs_mut(expr) {
                    Some(attrs) => (attrs, takes),
                    None => return visit_mut::visit_stmt_mut(self, stmt),
                }
            }
            Stmt::Item(_) => return visit_mut::visit_stmt_mut(self, stmt),
        };
        if let Some(span) = self.take(attrs) {
            if takes_lint {
                attrs.insert(0, clippy_allow(span));
            }
        }
        visit_mut::visit_stmt_mut(self, stmt);
    }

    fn visit_expr_mut(&mut self, expr: &mut Expr) {
        if let Some(attrs) = crate::analyze::expr_attrs_mut(expr) {
            self.take(attrs);
        }
        visit_mut::visit_expr_mut(self, expr);
    }

    fn visit_arm_mut(&mut self, arm: &mut syn::Arm) {
        self.take(&mut arm.attrs);
        visit_mut::visit_arm_mut(self, arm);
    }

    fn visit_field_value_mut(&mut self, field: &mut syn::FieldValue) {
        self.take(&mut field.attrs);
        visit_mut::visit_field_value_mut(self, field);
    }

    // Macro input is tokens to syn, but the compiler parses `format!`'s and `join!`'s
    // arguments as expressions, attributes included.
    fn visit_macro_mut(&mut self, mac: &mut syn::Macro) {
        mac.tokens = self.strip_tokens(std::mem::take(&mut mac.tokens));
    }

    fn visit_item_mut(&mut self, item: &mut syn::Item) {
        if let Some(attrs) = item_attrs_mut(item) {
            if let Some(span) = self.take(attrs) {
                if let Kind::Workflow = self.kind {
                    self.errors.push(syn::Error::new(
                        span,
                        "`#[workflow::allow(nondeterministic)]` goes on a statement or an \
                         expression: nested items are not scanned",
                    ));
                }
            }
        }
        visit_mut::visit_item_mut(self, item);
    }
}

fn item_attrs_mut(item: &mut syn::Item) -> Option<&mut Vec<Attribute>> {
    use syn::Item;
    Some(match item {
        Item::Const(item) => &mut item.attrs,
        Item::Enum(item) => &mut item.attrs,
        Item::ExternCrate(item) => &mut item.attrs,
        Item::Fn(item) => &mut item.attrs,
        Item::ForeignMod(item) => &mut item.attrs,
        Item::Impl(item) => &mut item.attrs,
        Item::Macro(item) => &mut item.attrs,
        Item::Mod(item) => &mut item.attrs,
        Item::Static(item) => &mut item.attrs,
        Item::Struct(item) => &mut item.attrs,
        Item::Trait(item) => &mut item.attrs,
        Item::TraitAlias(item) => &mut item.attrs,
        Item::Type(item) => &mut item.attrs,
        Item::Union(item) => &mut item.attrs,
        Item::Use(item) => &mut item.attrs,
        _ => return None,
    })
}
