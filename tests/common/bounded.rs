//! A binary run under a time limit and a cap on its address space, as the hostile-input tests
//! run `predict` and `prep`: an allocation the cap refuses aborts the child, which fails the
//! test as a signal, so "within the memory forecast" is checked, not hoped.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Address space allowed to a child: far above what any refusal needs, far below what the
/// hostile inputs used to ask for.
pub const MAX_AS: u64 = 4 << 30;

/// `BIN ARGS` with `env` set, bounded by `limit` and [`MAX_AS`]: (exit code, stdout + stderr).
/// A signal (an abort on a failed allocation, the kill at the limit) or a panic fails the test.
pub fn bounded(bin: &str, args: &[&str], env: &[(&str, &str)], limit: Duration) -> (i32, String) {
    let mut cmd = Command::new(bin);
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: MAX_AS,
                rlim_max: MAX_AS,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!("{bin} {args:?} ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let o = child.wait_with_output().unwrap();
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let code = status
        .code()
        .unwrap_or_else(|| panic!("{bin} {args:?} killed by a signal: {out}"));
    assert!(
        code != 101 && !out.contains("panicked"),
        "{bin} {args:?} panicked: {out}"
    );
    (code, out)
}
