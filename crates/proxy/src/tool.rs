//! Running the backends' command-line tools (`nft`, `iptables-restore`, ...).

use std::io::{self, Write};
use std::process::{Command, Stdio};

/// Why a tool run failed.
#[derive(Debug)]
pub(crate) enum ToolError {
    /// Starting it, feeding its stdin or waiting for it failed: the step (`cannot run`,
    /// `writing to`, `waiting for`) and the OS error.
    Io(&'static str, io::Error),
    /// It exited unsuccessfully: its exit code (none if killed by a signal) and its stderr,
    /// trimmed.
    Failed {
        /// The exit code.
        code: Option<i32>,
        /// Its stderr, trimmed.
        stderr: String,
    },
}

impl std::fmt::Display for ToolError {
    /// `cannot run: <os error>`, or `exit Some(1): <stderr>`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ToolError::Io(step, err) => write!(f, "{step}: {err}"),
            ToolError::Failed { code, stderr } => write!(f, "exit {code:?}: {stderr}"),
        }
    }
}

/// Runs `program` with `args`, feeding `stdin` (none: stdin is /dev/null); its stdout.
pub(crate) fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, ToolError> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| ToolError::Io("cannot run", e))?;
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("stdin is piped");
        pipe.write_all(input.as_bytes()).map_err(|e| ToolError::Io("writing to", e))?;
    }
    let output = child.wait_with_output().map_err(|e| ToolError::Io("waiting for", e))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
        Err(ToolError::Failed { code: output.status.code(), stderr })
    }
}
