//! Every case of the backend-neutral store conformance suite, each on a schema of its own.

clawgate_store::store_conformance_tests!(
    open = |dir: &std::path::Path| crate::common::open_dir(dir),
    persistent = true
);
