//! The fuzzer's seeds: the fixtures' real checkpoints (as torch.save wrote them) and the ct3d
//! weights rewritten by the tests' writer; and the hand-made hostile checkpoints, committed in
//! `tests/checkpoint_corpus/` as `refuse-NAME.pth`.

use super::archive;

/// Valid checkpoints: each is accepted.
pub(crate) fn seeds() -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = ["ct3d", "ct2d", "regions_resenc"]
        .iter()
        .map(|f| {
            std::fs::read(archive::results_dir(f).join("fold_0/checkpoint_final.pth")).unwrap()
        })
        .collect();
    let params = archive::fixture_params("ct3d");
    out.push(archive::checkpoint(
        &params,
        "3d_fullres",
        &mut |_, _, _| {},
    ));
    out
}

/// The hostile checkpoints (file name, bytes): each is refused.
pub(crate) fn handmade() -> Vec<(String, Vec<u8>)> {
    archive::hostile()
        .into_iter()
        .map(|(name, bytes, _)| (format!("refuse-{name}.pth"), bytes))
        .collect()
}

/// Whether an input is worth mutating: one whose pickle inflates past 1 MiB (the two million
/// nested lists) takes tens of milliseconds a run, a hundred times a fixture's, and is replayed
/// but not mutated.
pub(crate) fn mutable(input: &[u8]) -> bool {
    archive::entries_of(input).is_some_and(|es| es.iter().all(|(_, b)| b.len() <= 1 << 20))
}
