//! Compile-time behaviour: every accepted form compiles and runs, every misuse is an error
//! pointing at the offending token (expected output under `ui/fail/*.stderr`).

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*.rs");
    cases.compile_fail("tests/ui/fail/*.rs");
}
