//! The exit statuses of `prep` and `train`: one convention for both binaries, documented in the
//! README ("Commands") and in each binary's `--help`, so scripts and schedulers can tell "some
//! work failed" from "nothing could run" without parsing messages.

use std::process::ExitCode;

/// A closed standard output (`prep inspect DATA | head`) ends the process quietly, as Unix
/// tools do, instead of a panic in the next print: the default action of SIGPIPE, which the
/// Rust runtime ignores. Called first thing by every binary.
pub fn quiet_on_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition to its default, before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// How a command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// 0: the command did all of its work.
    Success,
    /// 1: the command ran, but some of its work failed: a case did not build, inspect found
    /// errors, `--verify` found damage.
    PartlyFailed,
    /// 2: the command could not run: bad arguments (clap's usage errors exit 2 too), a bad
    /// configuration or pipeline, an unreadable dataset or cache, a training error.
    CouldNotRun,
    /// 130: interrupted by Ctrl-C (128 + SIGINT, as shells report it).
    Interrupted,
}

impl Exit {
    /// The process's exit status.
    pub const fn code(self) -> u8 {
        match self {
            Exit::Success => 0,
            Exit::PartlyFailed => 1,
            Exit::CouldNotRun => 2,
            Exit::Interrupted => 130,
        }
    }

    /// `Success`, or `PartlyFailed` when `failed`.
    pub const fn unless_failed(failed: bool) -> Exit {
        if failed {
            Exit::PartlyFailed
        } else {
            Exit::Success
        }
    }
}

/// A binary's ending: its status, or the error that stopped it printed on stderr with its
/// causes and [`Exit::CouldNotRun`].
pub fn finish(result: anyhow::Result<Exit>) -> ExitCode {
    match result {
        Ok(exit) => exit.into(),
        Err(e) => {
            eprintln!("error: {}", message(&e));
            Exit::CouldNotRun.into()
        }
    }
}

/// An error and its causes joined by ": ", leaving out a cause the text before it already says
/// (our errors name the file and quote the operating system's error, which is also their source).
pub fn message(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
    }
    out
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e.code())
    }
}

/// The convention in words, for the binaries' `--help`.
pub const EXIT_STATUS_HELP: &str = "Exit status: 0 success; 1 the command ran but some of its \
work failed (a case did not build, inspect found errors or --verify found damage); 2 the command \
could not run (bad arguments, configuration or pipeline, unreadable dataset or cache, a training \
error); 130 interrupted by Ctrl-C.";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_already_said_are_not_repeated() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let e = anyhow::Error::new(crate::Error::io("/x/y.nii", io)).context("cannot open the run");
        let m = message(&e);
        assert_eq!(m.matches("not found").count(), 1, "{m}");
        assert!(m.starts_with("cannot open the run: /x/y.nii: "), "{m}");
    }

    #[test]
    fn codes() {
        let all = [
            Exit::Success,
            Exit::PartlyFailed,
            Exit::CouldNotRun,
            Exit::Interrupted,
        ];
        assert_eq!(all.map(Exit::code), [0, 1, 2, 130]);
        assert_eq!(Exit::unless_failed(true), Exit::PartlyFailed);
        assert_eq!(Exit::unless_failed(false), Exit::Success);
    }
}
