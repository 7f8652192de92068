//! The determinism scan of a `#[workflow]` body: a [`syn::visit::Visit`] that reports every
//! call or use of a path in the [`rules`](crate::rules) table, every `select!` without
//! `biased;`, and every iteration of a `HashMap`/`HashSet` the body binds, each at the whole
//! offending expression. It never stops at the first hit: the user sees all of them at once.
//!
//! What it reads: the body's statements, closures and `async` blocks (they run again on every
//! replay); the `use` items anywhere in the body, to resolve aliases
//! (`use std::time::SystemTime as Clock;`); and the tokens of macro invocations, parsed as
//! expressions where they are (`format!`, `join!`, `select!` branches) and otherwise read as a
//! token stream for paths. What it does not read: nested `fn`, `impl` and other items (they are
//! not the workflow's code until called, and a call from the body is just a call), and `use`
//! items outside the function, which a macro cannot see (clippy's `disallowed_methods` can; see
//! `docs/diagnostics.md`).
//!
//! Anything inside a statement or expression marked `#[workflow::allow(nondeterministic)]`
//! (see [`allow`](crate::allow)) is accepted.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use proc_macro2::{Delimiter, TokenStream, TokenTree};
use quote::{quote, ToTokens};
use syn::parse::{ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};
use syn::{Attribute, Expr, FnArg, ItemFn, Pat, Token, Type, UseTree};

use crate::allow;
use crate::errors::Errors;
use crate::parse::tidy;
use crate::rules::{self, Rule};

/// Scans `function`'s body, recording an error per nondeterministic expression.
pub(crate) fn workflow(function: &ItemFn, errors: &mut Errors) {
    let aliases = Aliases::of(&function.block);
    let mut scan = Scan {
        aliases: &aliases,
        hash_maps: HashMap::new(),
        opted_out: 0,
        order_insensitive: HashSet::new(),
        errors,
    };
    for input in &function.sig.inputs {
        if let FnArg::Typed(arg) = input {
            scan.bind(&arg.pat, Some(&arg.ty), None);
        }
    }
    scan.visit_block(&function.block);
}

/// The `use` items inside the body: name → full path, and the glob imports' modules.
#[derive(Default)]
struct Aliases {
    names: HashMap<String, Vec<String>>,
    globs: Vec<Vec<String>>,
}

impl Aliases {
    fn of(block: &syn::Block) -> Self {
        struct Collect(Aliases);

        impl<'ast> Visit<'ast> for Collect {
            fn visit_item(&mut self, item: &'ast syn::Item) {
                // Only `use` items: what other items contain is not the workflow's code.
                if let syn::Item::Use(item) = item {
                    self.0.add(Vec::new(), &item.tree);
                }
            }
        }

        let mut collect = Collect(Aliases::default());
        collect.visit_block(block);
        collect.0
    }

    fn add(&mut self, mut prefix: Vec<String>, tree: &UseTree) {
        match tree {
            UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.add(prefix, &path.tree);
            }
            UseTree::Name(name) if name.ident == "self" => {
                if let Some(last) = prefix.last().cloned() {
                    self.names.insert(last, prefix);
                }
            }
            UseTree::Name(name) => {
                let name = name.ident.to_string();
                prefix.push(name.clone());
                self.names.insert(name, prefix);
            }
            UseTree::Rename(rename) if rename.rename == "_" => {}
            UseTree::Rename(rename) => {
                if rename.ident != "self" {
                    prefix.push(rename.ident.to_string());
                }
                self.names.insert(rename.rename.to_string(), prefix);
            }
            UseTree::Glob(_) => self.globs.push(prefix),
            UseTree::Group(group) => {
                for tree in &group.items {
                    self.add(prefix.clone(), tree);
                }
            }
        }
    }

    /// What `segments` may refer to: itself with its first segment's alias expanded (through
    /// a few levels, `use std::time; use time::SystemTime;`), then under each glob import.
    fn resolve(&self, segments: Vec<String>, leading_colon: bool) -> Vec<Vec<String>> {
        if leading_colon || segments.is_empty() {
            return vec![segments];
        }
        let mut path = segments;
        for _ in 0..4 {
            match self.names.get(&path[0]) {
                Some(full) if full.len() > 1 || full.first().is_some_and(|f| *f != path[0]) => {
                    let mut expanded = full.clone();
                    expanded.extend_from_slice(&path[1..]);
                    path = expanded;
                }
                _ => break,
            }
        }
        let mut candidates = Vec::with_capacity(1 + self.globs.len());
        for glob in &self.globs {
            let mut under = glob.clone();
            under.extend_from_slice(&path);
            candidates.push(under);
        }
        candidates.insert(0, path);
        candidates
    }
}

/// Methods that iterate a collection in its own order.
const ITERATION: &[&str] = &[
    "iter",
    "iter_mut",
    "into_iter",
    "keys",
    "values",
    "values_mut",
    "into_keys",
    "into_values",
    "drain",
];

/// Adapters between an iteration and its consumer that keep the result order-independent.
const PASS_THROUGH: &[&str] = &["cloned", "copied"];

/// Consumers whose result does not depend on the iteration order.
const ORDER_INSENSITIVE: &[&str] = &["count", "sum", "product", "max", "min", "len"];

/// Constructors of a `HashMap`/`HashSet` with the process-random default hasher (one built
/// `with_hasher` has the caller's hasher, which is usually deterministic).
const HASH_CONSTRUCTORS: &[&str] = &["new", "with_capacity", "from", "from_iter", "default"];

struct Scan<'a> {
    aliases: &'a Aliases,
    /// Local names bound to a `HashMap` or `HashSet` → which one.
    hash_maps: HashMap<String, &'static str>,
    /// How many opt-outs enclose the expression being visited.
    opted_out: usize,
    /// Iterations (by address) whose result is consumed order-independently:
    /// `map.values().sum()`, `map.keys().collect::<BTreeSet<_>>()`; recorded just before the
    /// consumer's receiver is visited, removed when the iteration is.
    order_insensitive: HashSet<usize>,
    errors: &'a mut Errors,
}

impl Scan<'_> {
    fn report(&mut self, tokens: impl ToTokens, message: String) {
        if self.opted_out == 0 {
            self.errors.spanned(tokens, message);
        }
    }

    /// Reports `path` (its segments as written) if it matches a rule. `code` is how the message
    /// shows the offending expression; `tokens` span it.
    fn check_path(
        &mut self,
        segments: Vec<String>,
        leading_colon: bool,
        code: &str,
        tokens: impl ToTokens,
    ) {
        let written = segments.clone();
        let Some((rule, resolved)) = self
            .aliases
            .resolve(segments, leading_colon)
            .into_iter()
            .find_map(|candidate| rules::matching(&candidate).map(|rule| (rule, candidate)))
        else {
            return;
        };
        let resolved = (resolved != written).then(|| resolved.join("::"));
        self.report(tokens, message(rule, code, resolved.as_deref()));
    }

    fn check_expr_path(&mut self, path: &syn::ExprPath, code: &str, tokens: impl ToTokens) {
        let mut segments = Vec::new();
        let mut leading_colon = path.path.leading_colon.is_some();
        // `<SystemTime>::now()` and `<SystemTime as Trait>::now()` name `SystemTime::now`.
        if let Some(qself) = &path.qself {
            match &*qself.ty {
                Type::Path(ty) if ty.qself.is_none() => {
                    leading_colon = ty.path.leading_colon.is_some();
                    segments.extend(ty.path.segments.iter().map(|s| s.ident.to_string()));
                }
                _ => return,
            }
        }
        let skip = path.qself.as_ref().map_or(0, |qself| qself.position);
        segments.extend(
            path.path
                .segments
                .iter()
                .skip(skip)
                .map(|s| s.ident.to_string()),
        );
        self.check_path(segments, leading_colon, code, tokens);
    }

    /// `HashMap` or `HashSet` when `ty` is one with the default hasher.
    fn hash_type(&self, ty: &Type) -> Option<&'static str> {
        let Type::Path(ty) = ty else {
            return None;
        };
        let last = ty.path.segments.last()?;
        let written: Vec<String> = ty
            .path
            .segments
            .iter()
            .map(|s| s.ident.to_string())
            .collect();
        let resolved = self
            .aliases
            .resolve(written, ty.path.leading_colon.is_some())
            .remove(0);
        let kind = hash_kind(resolved.last()?)?;
        // A third (map) or second (set) type argument is a hasher chosen by the user.
        let arguments = match &last.arguments {
            syn::PathArguments::AngleBracketed(args) => args.args.len(),
            _ => 0,
        };
        let with_hasher = match kind {
            "HashMap" => arguments >= 3,
            _ => arguments >= 2,
        };
        (!with_hasher).then_some(kind)
    }

    /// `HashMap` or `HashSet` when `expr` builds one (or moves or clones a tracked one).
    fn hash_expr(&self, expr: &Expr) -> Option<&'static str> {
        match expr {
            Expr::Call(call) => {
                let Expr::Path(func) = &*call.func else {
                    return None;
                };
                let written: Vec<String> = func
                    .path
                    .segments
                    .iter()
                    .map(|s| s.ident.to_string())
                    .collect();
                let resolved = self
                    .aliases
                    .resolve(written, func.path.leading_colon.is_some())
                    .remove(0);
                match resolved.as_slice() {
                    [.., ty, constructor] if HASH_CONSTRUCTORS.contains(&constructor.as_str()) => {
                        hash_kind(ty)
                    }
                    _ => None,
                }
            }
            Expr::MethodCall(call) if call.method == "collect" => {
                let turbofish = call.turbofish.as_ref()?;
                match turbofish.args.first()? {
                    syn::GenericArgument::Type(ty) => self.hash_type(ty),
                    _ => None,
                }
            }
            Expr::MethodCall(call) if call.method == "clone" => self.tracked(&call.receiver),
            Expr::Path(_) | Expr::Paren(_) | Expr::Group(_) => self.tracked(expr),
            _ => None,
        }
    }

    /// The tracked map `expr` names (`map`, `&map`, `&mut map`, `(map)`).
    fn tracked(&self, expr: &Expr) -> Option<&'static str> {
        self.tracked_name(expr)
            .and_then(|name| self.hash_maps.get(&name).copied())
    }

    fn tracked_name(&self, expr: &Expr) -> Option<String> {
        match expr {
            Expr::Path(path) if path.qself.is_none() => {
                path.path.get_ident().map(ToString::to_string)
            }
            Expr::Reference(reference) => self.tracked_name(&reference.expr),
            Expr::Paren(paren) => self.tracked_name(&paren.expr),
            Expr::Group(group) => self.tracked_name(&group.expr),
            _ => None,
        }
    }

    /// Records what the names bound by `pat` now hold: a `HashMap`/`HashSet` (from the type
    /// or the initializer) or something else, which shadows an earlier map of that name.
    fn bind(&mut self, pat: &Pat, ty: Option<&Type>, init: Option<&Expr>) {
        match pat {
            Pat::Ident(ident) if ident.subpat.is_none() => {
                // A written type decides (`HashMap<K, V, FxBuildHasher>` is deterministic
                // whatever builds it); `_` or none leaves it to the initializer.
                let kind = match ty {
                    Some(ty) if !matches!(ty, Type::Infer(_)) => self.hash_type(ty),
                    _ => init.and_then(|init| self.hash_expr(init)),
                };
                let name = ident.ident.to_string();
                match kind {
                    Some(kind) => self.hash_maps.insert(name, kind),
                    None => self.hash_maps.remove(&name),
                };
            }
            Pat::Type(typed) => self.bind(&typed.pat, Some(&typed.ty), init),
            other => {
                struct Names<'m>(&'m mut HashMap<String, &'static str>);
                impl<'ast> Visit<'ast> for Names<'_> {
                    fn visit_pat_ident(&mut self, ident: &'ast syn::PatIdent) {
                        self.0.remove(&ident.ident.to_string());
                        visit::visit_pat_ident(self, ident);
                    }
                }
                Names(&mut self.hash_maps).visit_pat(other);
            }
        }
    }

    /// Marks the iteration at the bottom of `chain` (`map.values()` in `map.values().copied()`)
    /// as consumed order-independently.
    fn order_insensitive_chain(&mut self, chain: &Expr) {
        let mut expr = chain;
        while let Expr::MethodCall(call) = expr {
            let method = call.method.to_string();
            if ITERATION.contains(&method.as_str()) {
                self.order_insensitive
                    .insert(call as *const syn::ExprMethodCall as usize);
                return;
            }
            if !PASS_THROUGH.contains(&method.as_str()) {
                return;
            }
            expr = &call.receiver;
        }
    }

    fn hash_iteration(&mut self, tokens: impl ToTokens, name: &str, kind: &str) {
        let rule = rules::hash_iteration();
        let code = tidy(&tokens.to_token_stream().to_string());
        self.report(
            tokens,
            format!(
                "`{code}` iterates `{name}`, a `{kind}`, which {}\nhelp: {}",
                rule.what, rule.instead
            ),
        );
    }

    /// `select!` without `biased;`, then whatever the macro's tokens contain.
    fn check_macro(&mut self, path: &syn::Path, tokens: &TokenStream, span: impl ToTokens) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        let resolved = self
            .aliases
            .resolve(segments, path.leading_colon.is_some())
            .remove(0);
        let name = resolved.last().map(String::as_str).unwrap_or_default();
        if name == "select" && !biased(tokens) {
            let rule = rules::unbiased_select();
            let code = format!("{}!", tidy(&path.to_token_stream().to_string()));
            let instead = if resolved.first().is_some_and(|first| first == "futures") {
                "use `futures::select_biased!`, which polls the branches in order"
            } else {
                rule.instead
            };
            self.report(span, format!("`{code}` {}\nhelp: {instead}", rule.what));
        }
        self.macro_tokens(name, tokens.clone());
    }

    /// Scans a macro's input: as the expressions it is made of where it parses as such, else
    /// token by token.
    fn macro_tokens(&mut self, name: &str, tokens: TokenStream) {
        if name == "select" || name == "select_biased" {
            if let Ok(exprs) = select_branches.parse2(tokens.clone()) {
                for expr in &exprs {
                    self.visit_expr(expr);
                }
                return;
            }
        }
        let list = Punctuated::<Expr, Token![,]>::parse_terminated;
        if let Ok(exprs) = list.parse2(tokens.clone()) {
            for expr in &exprs {
                self.visit_expr(expr);
            }
            return;
        }
        // `vec![value; n]`
        if let Ok(expr) = syn::parse2::<Expr>(quote!([#tokens])) {
            self.visit_expr(&expr);
            return;
        }
        self.token_paths(tokens);
    }

    /// The fallback for macro input that is not expressions: finds paths in the token stream
    /// (`a::b(..)`, `a::b`, nested `m!(..)`) and checks them.
    fn token_paths(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            if let TokenTree::Group(group) = &trees[i] {
                self.token_paths(group.stream());
                i += 1;
                continue;
            }
            let after_dot = i > 0 && is_punct(&trees[i - 1], '.');
            let Some((segments, leading_colon, end)) = token_path(&trees, i) else {
                i += 1;
                continue;
            };
            if after_dot {
                // A method or field: `x.now()` is the user's.
                i = end;
                continue;
            }
            match (trees.get(end), trees.get(end + 1)) {
                (Some(bang), Some(TokenTree::Group(group))) if is_punct(bang, '!') => {
                    let path: TokenStream = trees[i..end].iter().cloned().collect();
                    match syn::parse2::<syn::Path>(path) {
                        Ok(path) => {
                            let span: TokenStream = trees[i..=end].iter().cloned().collect();
                            self.check_macro(&path, &group.stream(), span);
                        }
                        Err(_) => self.token_paths(group.stream()),
                    }
                    i = end + 2;
                }
                (Some(TokenTree::Group(group)), _)
                    if group.delimiter() == Delimiter::Parenthesis =>
                {
                    let call: TokenStream = trees[i..=end].iter().cloned().collect();
                    let code = format!("{}{}", segments.join("::"), call_suffix(group.stream()));
                    self.check_path(segments, leading_colon, &code, call);
                    self.token_paths(group.stream());
                    i = end + 1;
                }
                _ => {
                    let path: TokenStream = trees[i..end].iter().cloned().collect();
                    let code = segments.join("::");
                    self.check_path(segments, leading_colon, &code, path);
                    i = end;
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Scan<'_> {
    fn visit_expr(&mut self, expr: &'ast Expr) {
        let opt_out = has_opt_out(expr_attrs(expr));
        self.opted_out += usize::from(opt_out);
        match expr {
            Expr::Call(call) => {
                if let Expr::Path(func) = &*call.func {
                    let code = format!(
                        "{}{}",
                        tidy(&func.to_token_stream().to_string()),
                        if call.args.is_empty() { "()" } else { "(..)" }
                    );
                    self.check_expr_path(func, &code, call);
                    for arg in &call.args {
                        self.visit_expr(arg);
                    }
                } else {
                    visit::visit_expr(self, expr);
                }
            }
            Expr::Path(path) => {
                let code = tidy(&path.to_token_stream().to_string());
                self.check_expr_path(path, &code, path);
            }
            Expr::ForLoop(for_loop) => {
                if let Some(name) = self.tracked_name(&for_loop.expr) {
                    if let Some(kind) = self.hash_maps.get(&name).copied() {
                        let (for_token, pat, in_token, iterated) = (
                            &for_loop.for_token,
                            &for_loop.pat,
                            &for_loop.in_token,
                            &for_loop.expr,
                        );
                        self.hash_iteration(
                            quote!(#for_token #pat #in_token #iterated),
                            &name,
                            kind,
                        );
                    }
                }
                visit::visit_expr(self, expr);
            }
            Expr::MethodCall(call) => {
                let method = call.method.to_string();
                let address = call as *const syn::ExprMethodCall as usize;
                // `remove`: an exemption is used once, right after it is made, so the address
                // of a freed node (macro input is parsed into temporaries) can never match later.
                if ITERATION.contains(&method.as_str()) && !self.order_insensitive.remove(&address)
                {
                    if let Some(name) = self.tracked_name(&call.receiver) {
                        if let Some(kind) = self.hash_maps.get(&name).copied() {
                            self.hash_iteration(call, &name, kind);
                        }
                    }
                }
                let collects_unordered = method == "collect"
                    && call.turbofish.as_ref().is_some_and(|turbofish| {
                        matches!(
                            turbofish.args.first(),
                            Some(syn::GenericArgument::Type(ty)) if unordered_collection(ty)
                        )
                    });
                if ORDER_INSENSITIVE.contains(&method.as_str()) || collects_unordered {
                    self.order_insensitive_chain(&call.receiver);
                }
                visit::visit_expr(self, expr);
            }
            _ => visit::visit_expr(self, expr),
        }
        self.opted_out -= usize::from(opt_out);
    }

    fn visit_local(&mut self, local: &'ast syn::Local) {
        let opt_out = has_opt_out(&local.attrs);
        self.opted_out += usize::from(opt_out);
        let ty = match &local.pat {
            Pat::Type(typed) => Some(&*typed.ty),
            _ => None,
        };
        if let Some(init) = &local.init {
            // `let sorted: BTreeMap<_, _> = map.into_iter().collect();`
            if ty.is_some_and(unordered_collection) {
                if let Expr::MethodCall(call) = &*init.expr {
                    if call.method == "collect" {
                        self.order_insensitive_chain(&call.receiver);
                    }
                }
            }
            self.visit_expr(&init.expr);
            if let Some((_, diverge)) = &init.diverge {
                self.visit_expr(diverge);
            }
        }
        self.bind(
            &local.pat,
            None,
            local.init.as_ref().map(|init| &*init.expr),
        );
        self.opted_out -= usize::from(opt_out);
    }

    fn visit_stmt_macro(&mut self, mac: &'ast syn::StmtMacro) {
        let opt_out = has_opt_out(&mac.attrs);
        self.opted_out += usize::from(opt_out);
        visit::visit_stmt_macro(self, mac);
        self.opted_out -= usize::from(opt_out);
    }

    fn visit_arm(&mut self, arm: &'ast syn::Arm) {
        let opt_out = has_opt_out(&arm.attrs);
        self.opted_out += usize::from(opt_out);
        visit::visit_arm(self, arm);
        self.opted_out -= usize::from(opt_out);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        let path = &mac.path;
        let bang = &mac.bang_token;
        self.check_macro(path, &mac.tokens, quote!(#path #bang));
    }

    // Nested items are not the workflow's code; `use` items were read by `Aliases`.
    fn visit_item(&mut self, _: &'ast syn::Item) {}
}

/// "`code` what\nhelp: instead"; `resolved` names what an alias stood for.
fn message(rule: &Rule, code: &str, resolved: Option<&str>) -> String {
    let mut message = format!("`{code}`");
    if let Some(resolved) = resolved {
        let _ = write!(message, " (`{resolved}`)");
    }
    let _ = write!(message, " {}\nhelp: {}", rule.what, rule.instead);
    message
}

fn hash_kind(name: &str) -> Option<&'static str> {
    match name {
        "HashMap" => Some("HashMap"),
        "HashSet" => Some("HashSet"),
        _ => None,
    }
}

/// A collection whose contents do not depend on insertion order: collecting into it consumes
/// an iteration order-independently.
fn unordered_collection(ty: &Type) -> bool {
    let Type::Path(ty) = ty else {
        return false;
    };
    ty.path.segments.last().is_some_and(|last| {
        ["BTreeMap", "BTreeSet", "HashMap", "HashSet", "BinaryHeap"]
            .iter()
            .any(|name| last.ident == name)
    })
}

fn has_opt_out(attrs: &[Attribute]) -> bool {
    attrs.iter().any(allow::is_opt_out)
}

/// `select!` input starting with `biased;`.
fn biased(tokens: &TokenStream) -> bool {
    let mut tokens = tokens.clone().into_iter();
    matches!(
        (tokens.next(), tokens.next()),
        (Some(TokenTree::Ident(ident)), Some(TokenTree::Punct(semi)))
            if ident == "biased" && semi.as_char() == ';'
    )
}

/// The expressions of `select!` branches: `[biased;] pat = future [, if guard] => handler,`
/// and `else`/`complete`/`default => handler`.
fn select_branches(input: ParseStream) -> syn::Result<Vec<Expr>> {
    let mut exprs = Vec::new();
    if input.peek(syn::Ident) && input.peek2(Token![;]) {
        input.parse::<syn::Ident>()?;
        input.parse::<Token![;]>()?;
    }
    while !input.is_empty() {
        let fallback = (input.peek(Token![else]) || input.peek(Token![default]))
            && input.peek2(Token![=>])
            || input.peek(syn::Ident) && input.peek2(Token![=>]);
        if !fallback {
            Pat::parse_multi_with_leading_vert(input)?;
            input.parse::<Token![=]>()?;
            exprs.push(input.parse::<Expr>()?);
            if input.peek(Token![,]) && input.peek2(Token![if]) {
                input.parse::<Token![,]>()?;
                input.parse::<Token![if]>()?;
                exprs.push(input.parse::<Expr>()?);
            }
        } else if input.peek(Token![else]) {
            input.parse::<Token![else]>()?;
        } else if input.peek(Token![default]) {
            input.parse::<Token![default]>()?;
        } else {
            input.parse::<syn::Ident>()?;
        }
        input.parse::<Token![=>]>()?;
        let handler = if input.peek(syn::token::Brace) {
            Expr::Block(input.parse()?)
        } else {
            input.parse()?
        };
        exprs.push(handler);
        input.parse::<Option<Token![,]>>()?;
    }
    Ok(exprs)
}

fn is_punct(tree: &TokenTree, ch: char) -> bool {
    matches!(tree, TokenTree::Punct(punct) if punct.as_char() == ch)
}

/// The path starting at `trees[start]`: `[::]a::b[::<..>]`, as its segments, whether it starts
/// with `::`, and the index after it.
fn token_path(trees: &[TokenTree], start: usize) -> Option<(Vec<String>, bool, usize)> {
    let double_colon = |i: usize| {
        trees.get(i).is_some_and(|t| is_punct(t, ':'))
            && trees.get(i + 1).is_some_and(|t| is_punct(t, ':'))
    };
    let mut i = start;
    let leading_colon = double_colon(i);
    if leading_colon {
        i += 2;
    }
    let mut segments = Vec::new();
    while let Some(TokenTree::Ident(ident)) = trees.get(i) {
        segments.push(ident.to_string());
        i += 1;
        if !double_colon(i) {
            break;
        }
        if trees.get(i + 2).is_some_and(|t| is_punct(t, '<')) {
            // A turbofish ends the path: skip its balanced `<..>`.
            let mut depth = 0usize;
            let mut j = i + 2;
            while let Some(tree) = trees.get(j) {
                if is_punct(tree, '<') {
                    depth += 1;
                } else if is_punct(tree, '>') && !trees.get(j - 1).is_some_and(|t| is_punct(t, '-'))
                {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                j += 1;
            }
            i = j + 1;
            break;
        }
        i += 2;
    }
    (!segments.is_empty()).then_some((segments, leading_colon, i))
}

fn call_suffix(args: TokenStream) -> &'static str {
    if args.is_empty() {
        "()"
    } else {
        "(..)"
    }
}

/// The outer attributes of `expr`.
pub(crate) fn expr_attrs(expr: &Expr) -> &[Attribute] {
    macro_rules! attrs {
        ($($variant:ident)*) => {
            match expr {
                $(Expr::$variant(expr) => &expr.attrs,)*
                _ => &[],
            }
        };
    }
    attrs!(Array Assign Async Await Binary Block Break Call Cast Closure Const Continue Field
        ForLoop Group If Index Infer Let Lit Loop Macro Match MethodCall Paren Path Range RawAddr
        Reference Repeat Return Struct Try TryBlock Tuple Unary Unsafe While Yield)
}

/// The outer attributes of `expr`, to remove the opt-outs from.
pub(crate) fn expr_attrs_mut(expr: &mut Expr) -> Option<&mut Vec<Attribute>> {
    macro_rules! attrs {
        ($($variant:ident)*) => {
            match expr {
                $(Expr::$variant(expr) => Some(&mut expr.attrs),)*
                _ => None,
            }
        };
    }
    attrs!(Array Assign Async Await Binary Block Break Call Cast Closure Const Continue Field
        ForLoop Group If Index Infer Let Lit Loop Macro Match MethodCall Paren Path Range RawAddr
        Reference Repeat Return Struct Try TryBlock Tuple Unary Unsafe While Yield)
}

#[cfg(test)]
mod tests {
    use crate::errors::Errors;
    use crate::rules::RULES;

    /// The messages' first lines for `body` scanned as a workflow's.
    fn hits(args: &str, body: &str) -> Vec<String> {
        let function: syn::ItemFn =
            syn::parse_str(&format!("async fn wf({args}) -> Result<()> {{ {body} }}"))
                .unwrap_or_else(|error| panic!("the test body must parse: {error}\n{body}"));
        let mut errors = Errors::default();
        super::workflow(&function, &mut errors);
        errors.into_error().map_or_else(Vec::new, |errors| {
            errors
                .into_iter()
                .map(|error| error.to_string().lines().next().unwrap().to_owned())
                .collect()
        })
    }

    #[test]
    fn each_rules_example_is_one_hit_of_that_rule() {
        for rule in RULES {
            let found = hits("", rule.example);
            assert_eq!(found.len(), 1, "{}: {found:#?}", rule.name);
            assert!(found[0].ends_with(rule.what), "{}: {}", rule.name, found[0]);
        }
    }

    #[test]
    fn every_hit_is_reported_with_the_code_as_written() {
        let found = hits(
            "",
            "let a = std::time::SystemTime::now();
             let b = rand::random::<u64>();
             tokio::time::sleep(d).await;
             std::thread::spawn(move || work(a, b));",
        );
        assert_eq!(
            found,
            [
                "`std::time::SystemTime::now()` reads the clock, which returns a different time \
                 when the run is replayed",
                "`rand::random::<u64>()` draws a new random value when the run is replayed, so \
                 replay can take a different path",
                "`tokio::time::sleep(..)` is a timer in this process's memory: a restart forgets \
                 it and waits all over again",
                "`std::thread::spawn(..)` runs work outside the workflow: replay cannot record, \
                 order or resume it",
            ]
        );
    }

    #[test]
    fn aliases_inside_the_function_are_resolved() {
        let found = hits(
            "",
            "use std::time::SystemTime as Clock;
             use std::{thread, fs::{self, read_to_string as slurp}};
             use tokio::spawn;
             let now = Clock::now();
             thread::sleep(d);
             let text = slurp(\"x\");
             let more = fs::read(\"y\");
             spawn(async {});
             let typed = <Clock>::now();",
        );
        assert_eq!(found.len(), 6, "{found:#?}");
        for (hit, expected) in found.iter().zip([
            "`Clock::now()` (`std::time::SystemTime::now`)",
            "`thread::sleep(..)` (`std::thread::sleep`)",
            "`slurp(..)` (`std::fs::read_to_string`)",
            "`fs::read(..)` (`std::fs::read`)",
            "`spawn(..)` (`tokio::spawn`)",
            "`<Clock>::now()` (`std::time::SystemTime::now`)",
        ]) {
            assert!(hit.starts_with(expected), "{hit}");
        }
    }

    #[test]
    fn odd_use_items_do_not_panic() {
        let found = hits(
            "",
            "use self as x; use x::y as x; use {self}; let a = x::now();",
        );
        assert_eq!(found, Vec::<String>::new());
    }

    #[test]
    fn glob_imports_are_resolved() {
        let found = hits("", "use std::fs::*; let text = read_to_string(\"x\");");
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("`read_to_string(..)` (`std::fs::read_to_string`)"));
    }

    #[test]
    fn closures_and_async_blocks_are_scanned_nested_items_are_not() {
        let found = hits(
            "",
            "let f = || std::time::Instant::now();
             let g = async move { let _ = rand::random::<u8>(); };
             fn helper() -> std::time::SystemTime { std::time::SystemTime::now() }
             impl Foo { fn now() { let _ = std::time::Instant::now(); } }
             const X: fn() = || { std::thread::sleep(d) };",
        );
        assert_eq!(found.len(), 2, "{found:#?}");
    }

    #[test]
    fn user_names_and_the_deterministic_stand_ins_pass() {
        let found = hits(
            "clock: Clock",
            "let a = now();
             let b = clock.now();
             let c = Clock::now();
             let d = spawn(work);
             let e = random::<u64>();
             let f = workflow_core::random::<u64>();
             let g = workflow_core::now();
             sleep(Duration::from_secs(1)).await;
             workflow_core::sleep(Duration::from_secs(1)).await;
             let h: std::time::SystemTime = workflow_core::now();
             let i = std::time::SystemTime::UNIX_EPOCH;
             let j = scheduler.spawn(job);
             let k = self::timing::sleep(d);
             let l = std::env::consts::OS;
             let m = std::net::Ipv4Addr::new(127, 0, 0, 1);",
        );
        assert_eq!(found, Vec::<String>::new());
    }

    #[test]
    fn macro_bodies_are_scanned() {
        let found = hits(
            "",
            "println!(\"{:?}\", std::time::SystemTime::now());
             let v = vec![rand::random::<u8>(); 4];
             let (a, b) = futures::join!(step_a(), async { tokio::time::sleep(d).await });
             tracing::info!(at = ?chrono::Utc::now(), \"started\");
             assert!(matches!(std::env::var(\"X\"), Ok(v) if v.is_empty()));",
        );
        assert_eq!(found.len(), 5, "{found:#?}");
        assert!(found[3].starts_with("`chrono::Utc::now()`"), "{}", found[3]);
        assert!(found[4].starts_with("`std::env::var(..)`"), "{}", found[4]);
    }

    #[test]
    fn select_needs_biased() {
        let found = hits(
            "",
            "tokio::select! { biased; _ = a() => {}, _ = b() => {} }
             tokio::select! { _ = a() => {}, v = b(), if ready => { let _ = v; } }
             futures::select! { x = a => x, complete => 0 }
             futures::select_biased! { x = a => x, default => 0 }
             select! { _ = a() => {}, else => { std::thread::sleep(d) } }",
        );
        assert_eq!(found.len(), 4, "{found:#?}");
        assert!(found[0].starts_with("`tokio::select!`"));
        assert!(found[1].starts_with("`futures::select!`"));
        assert!(found[2].starts_with("`select!`"));
        assert!(found[3].starts_with("`std::thread::sleep(..)`"));
    }

    #[test]
    fn hash_maps_bound_in_the_body_or_taken_as_arguments_must_not_be_iterated() {
        let found = hits(
            "prices: HashMap<String, u64>",
            "let mut totals = HashMap::new();
             let seen: HashSet<u64> = HashSet::with_capacity(4);
             let index = items.iter().map(|i| (i.id, i)).collect::<HashMap<_, _>>();
             let copy = totals.clone();
             for (k, v) in &totals {}
             for id in seen.iter() {}
             let ids: Vec<_> = index.keys().collect();
             copy.into_iter().for_each(drop);
             for p in prices.values() {}",
        );
        assert_eq!(found.len(), 5, "{found:#?}");
        assert!(found[0].starts_with("`for (k, v) in &totals` iterates `totals`, a `HashMap`"));
        assert!(found[1].starts_with("`seen.iter()` iterates `seen`, a `HashSet`"));
    }

    #[test]
    fn order_independent_uses_of_hash_maps_pass() {
        let found = hits(
            "",
            "let mut totals = HashMap::new();
             totals.insert(1, 2);
             let sum: u64 = totals.values().sum();
             let count = totals.keys().count();
             let max = totals.values().copied().max();
             let sorted: BTreeMap<_, _> = totals.iter().collect();
             let keys = totals.keys().cloned().collect::<BTreeSet<_>>();
             let fast = HashMap::with_hasher(FxBuildHasher);
             for x in fast.iter() {}
             let custom: HashMap<u8, u8, FxBuildHasher> = HashMap::default();
             for x in &custom {}
             let ordered = BTreeMap::new();
             for x in &ordered {}
             let totals = vec![1, 2];
             for x in &totals {}",
        );
        assert_eq!(found, Vec::<String>::new());
    }

    #[test]
    fn opt_outs_accept_what_they_mark_only() {
        let found = hits(
            "",
            "#[workflow::allow(nondeterministic)]
             let started = std::time::Instant::now();
             let id = #[workflow::allow(nondeterministic, reason = \"log only\")] uuid::Uuid::new_v4();
             #[workflow::allow(nondeterministic)]
             tracing::info!(at = ?std::time::SystemTime::now());
             match x { #[workflow::allow(nondeterministic)] _ => std::thread::sleep(d) }
             let not_allowed = std::time::Instant::now();",
        );
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(found[0].starts_with("`std::time::Instant::now()`"));
    }
}
