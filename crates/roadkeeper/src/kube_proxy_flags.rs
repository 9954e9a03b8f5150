//! kube-proxy flags that roadkeeper does not take, typed by habit: the command line is refused
//! as clap refuses any unknown flag, but with what roadkeeper does instead. Every other error
//! (a typo among our own flags) is clap's.

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{CommandFactory, Parser};

use crate::cli::Cli;

/// What to write instead of kube-proxy's `--v=N` (or `-v N`).
const VERBOSITY: &str = "roadkeeper's verbosity is -v (info), -vv (debug) or -vvv (trace), \
    without a number, or RUST_LOG (e.g. RUST_LOG=debug); by default it logs warnings and its own info lines";

/// kube-proxy flags roadkeeper does not take, and what it does instead.
const INSTEAD: &[(&str, &str)] = &[
    ("--v", VERBOSITY),
    ("--cleanup", "run `roadkeeper cleanup`, a command of its own"),
    (
        "--bind-address",
        "roadkeeper proxy binds no proxy address, and takes the node's primary IPs from its Node \
         object (InternalIP, else ExternalIP), else the host's first global address of each family; \
         its servers' addresses are --healthz-bind-address and --metrics-bind-address",
    ),
    ("--bind-address-hard-fail", "a server address roadkeeper cannot bind always fails the start"),
    (
        "--master",
        "roadkeeper finds the API server in --kubeconfig (else KUBECONFIG, ~/.kube/config, the \
         in-cluster service account): put the URL in a kubeconfig",
    ),
    ("--kube-api-qps", "roadkeeper's API client has no client-side rate limit: leave it out"),
    ("--kube-api-burst", "roadkeeper's API client has no client-side rate limit: leave it out"),
    ("--kube-api-content-type", "roadkeeper's API client picks its own content type: leave it out"),
    ("--config-sync-period", "roadkeeper's watches have no periodic resync: leave it out"),
    ("--detect-local-mode", "roadkeeper detects local traffic by --cluster-cidr only (kube-proxy's ClusterCIDR mode)"),
    ("--pod-bridge-interface", "roadkeeper detects local traffic by --cluster-cidr only"),
    ("--pod-interface-name-prefix", "roadkeeper detects local traffic by --cluster-cidr only"),
    ("--feature-gates", "roadkeeper has no feature gates: leave it out"),
    ("--write-config-to", "roadkeeper does not write its configuration out"),
    ("--profiling", "roadkeeper serves no profiling endpoint"),
    ("--oom-score-adj", "set the container's OOM score through its resources (Guaranteed QoS in deploy/)"),
];

/// The command line parsed, or exits as clap does (status 2), naming what roadkeeper does instead
/// of a kube-proxy flag it was given.
pub fn parse() -> Cli {
    let argv: Vec<String> = std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect();
    match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(err) => match instead(&err, &argv) {
            Some(message) => Cli::command().error(ErrorKind::UnknownArgument, message).exit(),
            None => err.exit(),
        },
    }
}

/// The message for a clap error that is about a kube-proxy flag, if it is.
fn instead(err: &clap::Error, argv: &[String]) -> Option<String> {
    // A stray number before the subcommand is taken for one.
    if !matches!(err.kind(), ErrorKind::UnknownArgument | ErrorKind::InvalidSubcommand) {
        return None;
    }
    let invalid = err.get(ContextKind::InvalidArg).or_else(|| err.get(ContextKind::InvalidSubcommand));
    let Some(ContextValue::String(arg)) = invalid else { return None };
    let flag = arg.split('=').next().unwrap_or(arg);
    if let Some((name, tip)) = INSTEAD.iter().find(|(name, _)| *name == flag) {
        return Some(format!("{name} is kube-proxy's, not roadkeeper's: {tip}"));
    }
    // `-v 2`: our -v counts, so the number is a stray argument.
    let follows_v = argv.windows(2).any(|w| w[1] == *arg && w[0].len() > 1 && w[0][1..].bytes().all(|b| b == b'v'));
    (follows_v && arg.bytes().all(|b| b.is_ascii_digit()))
        .then(|| format!("-v {arg} is kube-proxy's (klog) verbosity, not roadkeeper's: {VERBOSITY}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The message roadkeeper gives for `argv`: `Some` for a kube-proxy flag, `None` when clap's
    /// own error stands; panics if the line parses.
    fn message(argv: &[&str]) -> Option<String> {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        let err = Cli::try_parse_from(&argv).expect_err("refused");
        instead(&err, &argv)
    }

    #[test]
    fn kube_proxy_flags_point_to_what_roadkeeper_does_instead() {
        for (argv, pointer) in [
            (&["roadkeeper", "proxy", "--v=2"][..], "-vv (debug)"),
            (&["roadkeeper", "proxy", "--v", "2"], "RUST_LOG"),
            (&["roadkeeper", "proxy", "-v", "2"], "-v 2 is kube-proxy's"),
            (&["roadkeeper", "-v", "4", "proxy"], "-vvv (trace)"),
            (&["roadkeeper", "proxy", "--cleanup"], "`roadkeeper cleanup`"),
            (&["roadkeeper", "proxy", "--bind-address=0.0.0.0"], "--metrics-bind-address"),
            (&["roadkeeper", "rules", "--master", "https://10.0.0.1"], "--kubeconfig"),
            (&["roadkeeper", "proxy", "--write-config-to", "/x"], "does not write its configuration"),
        ] {
            let message = message(argv).unwrap_or_else(|| panic!("{argv:?}: clap's error"));
            assert!(message.contains(pointer), "{argv:?}: {message}");
        }
    }

    #[test]
    fn other_errors_stay_claps() {
        for argv in [
            &["roadkeeper", "proxy", "--oncee"][..],
            &["roadkeeper", "proxy", "2"],
            &["roadkeeper", "proxy", "--proxy-mode"],
            &["roadkeeper", "proxy", "--vv"],
        ] {
            assert_eq!(message(argv), None, "{argv:?}");
        }
    }
}
