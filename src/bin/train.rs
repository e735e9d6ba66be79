//! `train`: the candle 3D U-Net trainer. Not built yet: see issue 4 and README.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!(
        "train is not built yet: `prep build-cache` writes the cache it will stream from (see README, Roadmap)."
    );
    ExitCode::from(2)
}
