//! Running external commands with readable errors.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use anyhow::{Context, Result, bail};

/// Runs `command` to completion; a non-zero exit is an error carrying stderr.
pub(crate) fn output(command: &mut Command) -> Result<Output> {
    let output = command.output().with_context(|| format!("cannot start {command:?}"))?;
    check(command, output)
}

/// Like [`output`], writing `input` to the command's standard input.
pub(crate) fn output_with_input(command: &mut Command, input: &str) -> Result<Output> {
    command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().with_context(|| format!("cannot start {command:?}"))?;
    let written = child.stdin.take().map(|mut stdin| stdin.write_all(input.as_bytes()));
    let output = child.wait_with_output().with_context(|| format!("cannot wait for {command:?}"))?;
    if let Some(Err(err)) = written {
        bail!("{command:?}: cannot write its input: {err}");
    }
    check(command, output)
}

fn check(command: &Command, output: Output) -> Result<Output> {
    if !output.status.success() {
        bail!("{command:?} failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(output)
}
