use workflow_core::prelude::*;

#[step]
async fn parse(input: String) -> std::result::Result<u64, String> {
    input.parse().map_err(|_| input.clone())
}

#[workflow]
async fn process(input: String) -> std::result::Result<u64, std::num::ParseIntError> {
    input.parse()
}

fn main() {}
