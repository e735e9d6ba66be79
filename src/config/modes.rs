//! Options that belong to one mode of a command. A binary's flags are one flat list, but some
//! apply only when another flag chose a mode (`predict --model` or `--nnunet-model`; a cache on
//! S3 or in a folder): an option given where it does not apply is refused, naming it and the
//! mode, never dropped without a word. Only what the user typed counts (a default never does).
//!
//! [`Given`] is how a binary tells what was typed; each command's rules (which options each of
//! its modes refuses) are in a submodule: [`train`], [`evaluate`], [`build`] (`prep
//! build-cache`). `predict` and `prep inspect` keep theirs beside their arguments.

use clap::parser::ValueSource;
use clap::{ArgMatches, Command};

use crate::error::{Error, Result};

pub mod build;
pub mod evaluate;
pub mod train;

/// The options given on the command line (not defaults), each with its spelling.
#[derive(Clone, Debug, Default)]
pub struct Given {
    given: Vec<(String, String)>,
}

impl Given {
    /// What the user typed of `cmd`'s arguments in `matches` (the subcommand's own, for one).
    pub fn of(cmd: &Command, matches: &ArgMatches) -> Given {
        let given = cmd
            .get_arguments()
            .filter(|a| {
                matches!(
                    matches.value_source(a.get_id().as_str()),
                    Some(ValueSource::CommandLine)
                )
            })
            .map(|a| {
                let spelled = match (a.get_long(), a.get_short()) {
                    (Some(l), _) => format!("--{l}"),
                    (None, Some(s)) => format!("-{s}"),
                    (None, None) => a.get_id().to_string(),
                };
                (a.get_id().to_string(), spelled)
            })
            .collect();
        Given { given }
    }

    /// Whether the option of clap id `id` was typed.
    pub fn has(&self, id: &str) -> bool {
        self.given.iter().any(|(i, _)| i == id)
    }

    /// How the option of clap id `id` is spelled (`--step-size`).
    pub fn spelling(&self, id: &str) -> String {
        self.given
            .iter()
            .find(|(i, _)| i == id)
            .map(|(_, s)| s.clone())
            .unwrap_or_else(|| format!("--{}", id.replace('_', "-")))
    }

    /// Refuse the first of `ids` that was typed: it does not apply to `mode`; `hint` says what
    /// to give instead, when there is something.
    pub fn refuse(
        &self,
        ids: &[&str],
        mode: &str,
        hint: impl Fn(&str) -> Option<String>,
    ) -> Result<()> {
        for id in ids {
            if self.has(id) {
                let more = hint(id).map(|h| format!(": {h}")).unwrap_or_default();
                return Err(Error::Config(format!(
                    "{} does not apply to {mode}{more}",
                    self.spelling(id)
                )));
            }
        }
        Ok(())
    }

    /// Refuse two typed options that say the same thing two ways (`--overlap` and
    /// `--step-size`).
    pub fn one_of(&self, a: &str, b: &str) -> Result<()> {
        if self.has(a) && self.has(b) {
            return Err(Error::Config(format!(
                "{} and {} say the same thing two ways: give one",
                self.spelling(a),
                self.spelling(b)
            )));
        }
        Ok(())
    }
}
