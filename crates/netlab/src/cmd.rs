//! Running external commands with readable errors.

use std::process::{Command, Output};

use anyhow::{Context, Result, bail};

/// Runs `command` to completion; a non-zero exit is an error carrying stderr.
pub(crate) fn output(command: &mut Command) -> Result<Output> {
    let output = command.output().with_context(|| format!("cannot start {command:?}"))?;
    if !output.status.success() {
        bail!("{command:?} failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(output)
}
