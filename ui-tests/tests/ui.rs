//! What users see from the macros: each `fail/` case must fail to compile with exactly its
//! `.stderr`; each `pass/` case must compile. Regenerate with `TRYBUILD=overwrite` and review.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/*/pass/*.rs");
    t.compile_fail("tests/ui/*/fail/*.rs");
}
