//! The memory store's own tests: the conformance suite on one store and on shared clones.

use super::*;
use crate::testing::store::conformance_tests;

// Not run here: `compared` (this store is the reference the others are compared with), and
// `damage` (this store keeps decoded values, so nothing in it can be undecodable).
conformance_tests! {
    groups: [contract, inspect],
    one: {
        let store = MemoryStore::new();
    } => store,
    shared: {
        // Clones share one state, as workers in one process do.
        let a = MemoryStore::new();
        let stores = [a.clone(), a.clone(), a];
    } => stores,
}
