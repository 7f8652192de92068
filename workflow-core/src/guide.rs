// The pages of `docs/guide/`, one module each, so that they show in the API docs and every
// snippet in them is compiled (and, unless marked `no_run`, run) by `cargo test --doc`.
//
// A page links to the others by reference (`[queues][guide-queues]`), defined at its foot as
// the neighbouring markdown file. Each module's docs start with the same labels defined as
// the guide's modules (`links!`, in lib.rs): the first definition of a label wins, so rustdoc
// links module to module while the repository's markdown links file to file.
#![doc = links!()]
#![doc = include_str!("../guide/README.md")]

/// One page: `page!(name, "file.md")` is `pub mod name {}` documented by `docs/guide/file.md`.
macro_rules! page {
    ($name:ident, $file:literal) => {
        #[doc = links!()]
        #[doc = include_str!(concat!("../guide/", $file))]
        pub mod $name {}
    };
}

page!(steps, "steps.md");
page!(hooks, "hooks.md");
page!(determinism, "determinism.md");
page!(queues, "queues.md");
page!(children, "children.md");
page!(deploys, "deploys.md");
page!(streams, "streams.md");
page!(schedules, "schedules.md");
page!(messages, "messages.md");
page!(transactional, "transactional.md");
page!(continue_as_new, "continue_as_new.md");
page!(encryption, "encryption.md");
page!(observability, "observability.md");
page!(stores, "stores.md");
page!(testing, "testing.md");
page!(cli, "cli.md");
