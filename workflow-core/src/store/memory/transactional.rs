//! [`TransactionalStore`] in memory: there is no database of the user's to commit with, so
//! the memory store offers no transaction (the trait's default), and a transactional step on it
//! fails with an error naming "memory".

use super::MemoryStore;
use crate::store::TransactionalStore;

impl TransactionalStore for MemoryStore {}
