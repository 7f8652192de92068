//! The error accumulator: every check records its problem here instead of returning early, so
//! one compile shows the user every mistake in the attribute, the signature and the body at once.

use std::fmt::Display;

use proc_macro2::Span;
use quote::ToTokens;

#[derive(Default)]
pub(crate) struct Errors {
    errors: Vec<syn::Error>,
}

impl Errors {
    /// An error at `span`.
    pub(crate) fn at(&mut self, span: Span, message: impl Display) {
        self.push(syn::Error::new(span, message));
    }

    /// An error covering all of `tokens` (first to last token).
    pub(crate) fn spanned(&mut self, tokens: impl ToTokens, message: impl Display) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    pub(crate) fn push(&mut self, error: syn::Error) {
        self.errors.push(error);
    }

    /// Records `more`'s errors after this one's.
    pub(crate) fn extend(&mut self, more: Errors) {
        self.errors.extend(more.errors);
    }

    /// Every recorded error as one, if any.
    pub(crate) fn into_error(self) -> Option<syn::Error> {
        self.errors.into_iter().reduce(|mut all, next| {
            all.combine(next);
            all
        })
    }

    /// `Ok(value)` when nothing was recorded, otherwise every recorded error as one.
    pub(crate) fn finish<T>(self, value: T) -> syn::Result<T> {
        self.into_error().map_or(Ok(value), Err)
    }
}
