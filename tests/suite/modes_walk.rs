//! The walk the options-and-modes tests share (`flags*.rs`): every option a binary's `--help`
//! lists, given in every mode of the command, is refused (exit 2, the message naming the option
//! and the mode) where the table says so and never refused elsewhere; an option the table does
//! not place, or places without `--help` listing it, fails the walk. Each run is given inputs
//! that do not exist, so an option that is not refused fails fast on them, and nothing may be
//! written into the working folder.

use std::path::Path;
use std::process::Command;

use crate::common::fixtures::text;

/// The long options a binary's `--help` lists (with the subcommand's arguments before it).
pub(crate) fn help_options(exe: &str, sub: &[&str]) -> Vec<String> {
    let o = Command::new(exe).args(sub).arg("--help").output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let mut out: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.trim_start().starts_with('-'))
        .filter_map(|l| {
            l.split([' ', ',', '='])
                .find(|w| w.starts_with("--"))
                .map(str::to_string)
        })
        .filter(|o| o != "--help" && o != "--version")
        .collect();
    out.dedup();
    out
}

/// How an option fares in one mode.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Fate {
    /// Used (or taken as its equivalent): never refused.
    Used,
    /// Refused with exit status 2, the message naming the option and this mode.
    Refused(&'static str),
    /// Not walked in this mode: the option chooses the mode or another one (`--cv` beside
    /// PRED GT is clap's conflict).
    Chooses,
}

/// One option: its name, a value (`None` for a switch), its fate in each mode, and options it
/// needs beside it (given only in the modes whose own arguments lack them).
pub(crate) struct Row {
    pub(crate) name: &'static str,
    pub(crate) value: Option<String>,
    pub(crate) fates: Vec<Fate>,
    pub(crate) with: Vec<String>,
}

/// An option and its fate in each mode.
pub(crate) fn row(name: &'static str, value: Option<&str>, fates: &[Fate]) -> Row {
    Row {
        name,
        value: value.map(str::to_string),
        fates: fates.to_vec(),
        with: Vec::new(),
    }
}

impl Row {
    /// The row with `args` given beside the option (where the mode lacks the first of them).
    pub(crate) fn with(mut self, args: &[&str]) -> Row {
        self.with = args.iter().map(|a| a.to_string()).collect();
        self
    }
}

/// The same fate in each of `n` modes.
pub(crate) fn all(fate: Fate, n: usize) -> Vec<Fate> {
    vec![fate; n]
}

/// A binary, its modes and its table.
pub(crate) struct Walk<'a> {
    pub(crate) exe: &'a str,
    /// Arguments before the options (a subcommand), also given to `--help`.
    pub(crate) sub: Vec<&'a str>,
    /// Each mode's own arguments.
    pub(crate) modes: Vec<Vec<String>>,
    pub(crate) rows: Vec<Row>,
    /// The working folder of every run: empty, and left empty.
    pub(crate) cwd: &'a Path,
    pub(crate) env: Vec<(&'a str, &'a str)>,
}

impl Walk<'_> {
    pub(crate) fn run(&self) {
        let listed = help_options(self.exe, &self.sub);
        let what = format!("{} {}", self.exe, self.sub.join(" "));
        for o in &listed {
            assert!(
                self.rows.iter().any(|r| r.name == o),
                "{what} --help lists {o}, which this table does not place in its modes"
            );
        }
        for r in &self.rows {
            assert!(
                listed.iter().any(|o| o == r.name),
                "the table places {}, which {what} --help does not list",
                r.name
            );
            assert_eq!(r.fates.len(), self.modes.len(), "{}", r.name);
        }
        for r in &self.rows {
            for (args, fate) in self.modes.iter().zip(&r.fates) {
                // An option the mode gives itself is not given twice.
                if *fate == Fate::Chooses || args.iter().any(|a| a == r.name) {
                    continue;
                }
                let mut cmd = Command::new(self.exe);
                cmd.args(&self.sub).args(args).arg(r.name);
                cmd.args(&r.value);
                if !r.with.is_empty() && !args.contains(&r.with[0]) {
                    cmd.args(&r.with);
                }
                cmd.current_dir(self.cwd).envs(self.env.iter().copied());
                let o = cmd.output().unwrap();
                let said = text(&o);
                let refused = said.contains("does not apply to");
                let value = r.value.as_deref().unwrap_or("");
                let call = format!("{what} {} {} {value}", args.join(" "), r.name);
                match fate {
                    Fate::Refused(mode) => {
                        assert_eq!(o.status.code(), Some(2), "{call}: {said}");
                        assert!(
                            refused && said.contains(r.name) && said.contains(mode),
                            "{call} should be refused naming {} and {mode:?}: {said}",
                            r.name
                        );
                    }
                    Fate::Used => assert!(!refused, "{call} was refused: {said}"),
                    Fate::Chooses => unreachable!(),
                }
                let left = std::fs::read_dir(self.cwd).unwrap().count();
                assert_eq!(left, 0, "{call} wrote into its working folder: {said}");
            }
        }
    }
}

/// Command-line words.
pub(crate) fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// An empty working folder for the runs, in `t`.
pub(crate) fn empty_cwd(t: &tempfile::TempDir) -> std::path::PathBuf {
    let cwd = t.path().join("cwd");
    std::fs::create_dir(&cwd).unwrap();
    cwd
}
