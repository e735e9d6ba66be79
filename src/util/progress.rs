//! Progress bars of the long commands (build, predict, evaluate): drawn on stderr when it is a
//! terminal and the user did not ask for quiet, hidden otherwise (logs and pipes get the
//! summary lines only).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Where a bar draws: stderr when `enabled` and stderr is a terminal, else nowhere.
pub fn draw_target(enabled: bool) -> ProgressDrawTarget {
    if enabled && std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}

/// A bar of `len` steps drawn with `template` (indicatif's syntax) and `style`'s extra keys.
pub fn bar(
    enabled: bool,
    len: u64,
    template: &str,
    style: impl FnOnce(ProgressStyle) -> ProgressStyle,
) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(len), draw_target(enabled));
    if let Ok(s) = ProgressStyle::with_template(template) {
        bar.set_style(style(s).progress_chars("=> "));
    }
    bar
}
