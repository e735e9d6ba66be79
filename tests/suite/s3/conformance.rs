//! The storage seam's conformance suite (tests/suite/store_conformance.rs) against a bucket:
//! built through a staging folder, read through a local tier that fetches chunk files on
//! first read, exactly as `prep build-cache` and `train` reach a cache on S3.

use super::*;
use crate::store_conformance::{conforms, Store};
use voxcache::cache::s3::RemoteOptions;

#[test]
#[ignore = "needs an S3 server: SeaweedFS (bash scripts/python_env.sh; the test starts it) or VOXCACHE_TEST_S3_ENDPOINT; cargo test --test suite s3:: -- --ignored"]
fn a_bucket_with_its_staging_folder_and_local_tier_conforms() {
    let srv = server("conformance");
    let t = tempfile::tempdir().unwrap();
    let url = srv.url("conformance");
    let opts = |dir: &str| RemoteOptions {
        endpoint: Some(srv.endpoint.clone()),
        local: Some(t.path().join(dir)),
        budget: None,
    };
    let (client, prefix) = (srv.client(), srv.prefix(&url));
    conforms(&Store {
        location: url.clone(),
        build: opts("stage"),
        read: opts("tier"),
        env: vec![("AWS_ENDPOINT_URL".into(), srv.endpoint.clone())],
        remove_stored: Box::new(move |rel| client.delete(&format!("{prefix}/{rel}")).unwrap()),
    });
}
