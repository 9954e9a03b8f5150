//! The thin effectful layer of the iptables backend: `iptables-restore --noflush` (one call per
//! family, each table one transaction), `iptables-save` listings, `iptables -C` for the jumps
//! from the builtin chains, the `route_localnet` sysctl and the mangle canary check.
//!
//! Like kube-proxy's iptables-wrapper, the runner first works out whether the host uses the
//! legacy or the nft flavour of iptables, then uses only that flavour's binaries.

use std::collections::BTreeSet;
use std::path::Path;

use crate::Error;
use crate::tool::ToolError;
use roadkeeper_rules::iptables::cleanup;
use roadkeeper_rules::iptables::plan::{Jump, KUBE_PROXY_CANARY, is_service_chain};
use roadkeeper_rules::table::IpFamily;

/// Which iptables implementation the host uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    /// `iptables-nft`: the nf_tables kernel API with iptables syntax.
    Nft,
    /// `iptables-legacy`: the x_tables kernel API.
    Legacy,
}

impl Flavour {
    fn suffix(self) -> &'static str {
        match self {
            Flavour::Nft => "nft",
            Flavour::Legacy => "legacy",
        }
    }
}

/// The binaries of one flavour and family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tools {
    /// `iptables-nft`, `ip6tables-legacy`, ...
    pub iptables: String,
    /// `...-save`.
    pub save: String,
    /// `...-restore`.
    pub restore: String,
}

impl Tools {
    /// The binaries of `flavour` for `family`; the unflavoured names when the flavoured ones are
    /// not installed.
    pub fn of(flavour: Flavour, family: IpFamily) -> Tools {
        let base = match family {
            IpFamily::V4 => "iptables",
            IpFamily::V6 => "ip6tables",
        };
        let flavoured = format!("{base}-{}", flavour.suffix());
        let name = if in_path(&flavoured) { flavoured } else { base.to_string() };
        Tools { save: format!("{name}-save"), restore: format!("{name}-restore"), iptables: name }
    }
}

/// True if an executable `name` is on `$PATH`.
fn in_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(name).is_file()))
        .unwrap_or(false)
}

/// Runs a tool, feeding `stdin`; its stdout, or its stderr as the error:
/// [`Error::IptablesRefused`] when a restore blames a line of its input.
fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, Error> {
    crate::tool::run(program, args, stdin).map_err(|e| tool_error(program, args, e))
}

fn tool_error(program: &str, args: &[&str], e: ToolError) -> Error {
    match e {
        ToolError::Io(step, e) => Error::Iptables(format!("{step} {program}: {e}")),
        ToolError::Failed { stderr, .. } => {
            let text = format!("{program} {}: {stderr}", args.join(" "));
            if program.ends_with("-restore") && blames_the_input(&stderr) {
                Error::IptablesRefused(text)
            } else {
                Error::Iptables(text)
            }
        }
    }
}

/// Whether iptables-restore's error output blames a line of its input (`Error occurred at line:
/// N`, `line N failed`) rather than permission, the xtables lock or the kernel's tables, which
/// legacy iptables-restore also reports "at line 1".
fn blames_the_input(stderr: &str) -> bool {
    const NOT_THE_INPUT: [&str; 5] =
        ["Permission denied", "you must be root", "unable to initialize table", "xtables lock", "Resource temporarily"];
    let names_a_line = stderr
        .match_indices("line")
        .any(|(i, _)| stderr[i + 4..].trim_start_matches([':', ' ']).starts_with(|c: char| c.is_ascii_digit()));
    names_a_line && !NOT_THE_INPUT.iter().any(|m| stderr.contains(m))
}

/// What a flavour's listing holds, for [`choose_flavour`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlavourEvidence {
    /// kubelet's / kube-proxy's hint or canary chains are there.
    pub hint: bool,
    /// Rules mentioning `KUBE-`.
    pub kube_rules: usize,
    /// Rules at all.
    pub rules: usize,
}

impl FlavourEvidence {
    /// Reads an `iptables-save` listing.
    pub fn of(listing: &str) -> FlavourEvidence {
        let mut e = FlavourEvidence::default();
        for line in listing.lines() {
            if line.starts_with(":KUBE-IPTABLES-HINT ")
                || line.starts_with(":KUBE-KUBELET-CANARY ")
                || line.starts_with(":KUBE-PROXY-CANARY ")
            {
                e.hint = true;
            }
            if line.starts_with('-') {
                e.rules += 1;
                if line.contains("KUBE-") {
                    e.kube_rules += 1;
                }
            }
        }
        e
    }
}

/// iptables-wrapper's choice: the flavour with kube hint chains, else with more KUBE- rules,
/// else with more rules; nft when in doubt.
pub fn choose_flavour(legacy: FlavourEvidence, nft: FlavourEvidence) -> Flavour {
    if nft.hint {
        return Flavour::Nft;
    }
    if legacy.hint {
        return Flavour::Legacy;
    }
    if legacy.kube_rules != nft.kube_rules {
        return if legacy.kube_rules > nft.kube_rules { Flavour::Legacy } else { Flavour::Nft };
    }
    if legacy.rules > nft.rules { Flavour::Legacy } else { Flavour::Nft }
}

/// The listing of one flavour, both families (missing tools or tables list as nothing).
fn flavour_listing(flavour: Flavour) -> String {
    let mut text = String::new();
    for family in [IpFamily::V4, IpFamily::V6] {
        let base = match family {
            IpFamily::V4 => "iptables",
            IpFamily::V6 => "ip6tables",
        };
        let save = format!("{base}-{}-save", flavour.suffix());
        if in_path(&save) {
            text.push_str(&run(&save, &[], None).unwrap_or_default());
        }
    }
    text
}

/// Detects the host's flavour, as kube-proxy's iptables-wrapper does.
pub fn detect_flavour() -> Flavour {
    let legacy = FlavourEvidence::of(&flavour_listing(Flavour::Legacy));
    let nft = FlavourEvidence::of(&flavour_listing(Flavour::Nft));
    choose_flavour(legacy, nft)
}

/// True if this host (network namespace) has IPv6.
pub fn ipv6_available() -> bool {
    Path::new("/proc/sys/net/ipv6").exists()
}

/// Something that can program iptables: the real tools, or a recorder in tests.
pub trait IptablesRunner: Send {
    /// Applies one family's restore input with `iptables-restore --noflush`.
    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), Error>;
    /// Checks a restore input without committing it (`--test`).
    fn check(&mut self, family: IpFamily, input: &str) -> Result<(), Error>;
    /// True when [`check`](Self::check) judges an input against the kernel's current tables.
    /// The nft flavour's `--test` does not: it rejects references to chains that exist only in
    /// the kernel and accepts what the kernel refuses at commit.
    fn check_is_reliable(&mut self) -> bool {
        true
    }
    /// The per-Service chains (`KUBE-SVC-`, `KUBE-SEP-`, ...) now in the nat table.
    fn service_chains(&mut self, family: IpFamily) -> Result<BTreeSet<String>, Error>;
    /// The jumps from builtin chains that are not in place (`iptables -C`); the full sync inserts
    /// them in the same restore that creates their target chains.
    fn missing_jumps(&mut self, family: IpFamily, jumps: &[Jump]) -> Result<Vec<Jump>, Error>;
    /// Sets `net.ipv4.conf.all.route_localnet=1` (localhost NodePorts).
    fn enable_route_localnet(&mut self) -> Result<(), Error>;
    /// True while the mangle canary chains exist (nobody flushed the tables).
    fn healthy(&mut self) -> Result<bool, Error>;
    /// The families to program.
    fn families(&self) -> Vec<IpFamily> {
        vec![IpFamily::V4, IpFamily::V6]
    }
    /// True when a full sync goes faster as several restores of a few thousand chains each
    /// (`iptables-nft-restore`; the legacy flavour replaces the whole table at every restore).
    fn splits_full_syncs(&mut self) -> bool {
        false
    }
}

/// The host's iptables tools, of the detected flavour.
#[derive(Debug, Default)]
pub struct IptablesBinary {
    flavour: Option<Flavour>,
}

impl IptablesBinary {
    /// A runner that detects the flavour on first use.
    pub fn new() -> Self {
        IptablesBinary { flavour: None }
    }

    /// A runner for a known flavour.
    pub fn with_flavour(flavour: Flavour) -> Self {
        IptablesBinary { flavour: Some(flavour) }
    }

    /// The flavour in use (detected on first call).
    pub fn flavour(&mut self) -> Flavour {
        *self.flavour.get_or_insert_with(|| {
            let flavour = detect_flavour();
            tracing::info!(?flavour, "iptables flavour");
            flavour
        })
    }

    fn tools(&mut self, family: IpFamily) -> Tools {
        Tools::of(self.flavour(), family)
    }
}

impl IptablesRunner for IptablesBinary {
    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), Error> {
        let tools = self.tools(family);
        run(&tools.restore, &["-w", "5", "--noflush"], Some(input)).map(|_| ())
    }

    fn check(&mut self, family: IpFamily, input: &str) -> Result<(), Error> {
        let tools = self.tools(family);
        run(&tools.restore, &["-w", "5", "--noflush", "--test"], Some(input)).map(|_| ())
    }

    fn check_is_reliable(&mut self) -> bool {
        self.flavour() == Flavour::Legacy
    }

    fn splits_full_syncs(&mut self) -> bool {
        self.flavour() == Flavour::Nft
    }

    fn service_chains(&mut self, family: IpFamily) -> Result<BTreeSet<String>, Error> {
        let tools = self.tools(family);
        let listing = run(&tools.save, &["-t", "nat"], None)?;
        Ok(listing
            .lines()
            .filter_map(|l| l.strip_prefix(':')?.split_whitespace().next())
            .filter(|c| is_service_chain(c))
            .map(String::from)
            .collect())
    }

    fn missing_jumps(&mut self, family: IpFamily, jumps: &[Jump]) -> Result<Vec<Jump>, Error> {
        let tools = self.tools(family);
        Ok(jumps
            .iter()
            .filter(|jump| {
                let mut check = vec!["-w", "5", "-t", jump.table, "-C", jump.chain];
                check.extend(jump.args.iter().map(String::as_str));
                run(&tools.iptables, &check, None).is_err()
            })
            .cloned()
            .collect())
    }

    fn enable_route_localnet(&mut self) -> Result<(), Error> {
        let path = "/proc/sys/net/ipv4/conf/all/route_localnet";
        if std::fs::read_to_string(path).is_ok_and(|v| v.trim() == "1") {
            return Ok(());
        }
        std::fs::write(path, "1").map_err(|e| Error::Iptables(format!("setting {path}: {e}")))
    }

    /// The canary chain is there in every family; exit code 1 (no such chain; the nft flavour
    /// also says "incompatible" for a missing chain) means it is gone, anything else (2:
    /// parameters, 3: permission, 4: the lock) that it cannot be told.
    fn healthy(&mut self) -> Result<bool, Error> {
        for family in self.families() {
            let tools = self.tools(family);
            let args = ["-w", "5", "-t", "mangle", "-S", KUBE_PROXY_CANARY];
            match crate::tool::run(&tools.iptables, &args, None) {
                Ok(_) => {}
                Err(ToolError::Failed { code: Some(1), .. }) => return Ok(false),
                Err(e) => return Err(tool_error(&tools.iptables, &args, e)),
            }
        }
        Ok(true)
    }

    /// IPv6 first: IPv4's nat `KUBE-SERVICES` (what tools and people look at) appears last.
    fn families(&self) -> Vec<IpFamily> {
        if ipv6_available() { vec![IpFamily::V6, IpFamily::V4] } else { vec![IpFamily::V4] }
    }
}

/// A runner that applies nothing and remembers the restore inputs: for `roadkeeper rules` and
/// tests.
#[derive(Debug, Default)]
pub struct Recorder {
    /// Every restore input, in order, with its family.
    pub inputs: Vec<(IpFamily, String)>,
    /// The jumps asked about at the last full sync (all reported missing).
    pub jumps: Vec<(IpFamily, Jump)>,
    /// Ask for split full syncs, as the nft flavour does.
    pub split: bool,
}

impl Recorder {
    /// Every recorded input, each under a comment naming the command it is for: what
    /// `roadkeeper rules` prints.
    pub fn script(&self) -> String {
        self.inputs
            .iter()
            .map(|(family, input)| {
                let tool = if *family == IpFamily::V4 { "iptables-restore" } else { "ip6tables-restore" };
                format!("# {tool} --noflush\n{input}")
            })
            .collect()
    }
}

impl IptablesRunner for Recorder {
    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), Error> {
        self.inputs.push((family, input.to_string()));
        Ok(())
    }

    fn check(&mut self, _family: IpFamily, _input: &str) -> Result<(), Error> {
        Ok(())
    }

    fn service_chains(&mut self, _family: IpFamily) -> Result<BTreeSet<String>, Error> {
        Ok(BTreeSet::new())
    }

    fn missing_jumps(&mut self, family: IpFamily, jumps: &[Jump]) -> Result<Vec<Jump>, Error> {
        self.jumps.retain(|(f, _)| *f != family);
        self.jumps.extend(jumps.iter().map(|j| (family, j.clone())));
        Ok(jumps.to_vec())
    }

    fn enable_route_localnet(&mut self) -> Result<(), Error> {
        Ok(())
    }

    fn healthy(&mut self) -> Result<bool, Error> {
        Ok(true)
    }

    fn splits_full_syncs(&mut self) -> bool {
        self.split
    }
}

/// `roadkeeper cleanup` for iptables: removes our chains and the jumps to them (see
/// [`roadkeeper_rules::iptables::cleanup`]), from both flavours and both families. Tools or
/// tables that are missing are skipped.
pub fn cleanup() -> Result<(), Error> {
    let mut errors = Vec::new();
    for flavour in [Flavour::Legacy, Flavour::Nft] {
        for family in [IpFamily::V4, IpFamily::V6] {
            let base = match family {
                IpFamily::V4 => "iptables",
                IpFamily::V6 => "ip6tables",
            };
            let name = format!("{base}-{}", flavour.suffix());
            if !in_path(&format!("{name}-save")) {
                continue;
            }
            let Ok(listing) = run(&format!("{name}-save"), &[], None) else { continue };
            let input = cleanup::restore_input(&listing);
            if input.is_empty() {
                continue;
            }
            if let Err(err) = run(&format!("{name}-restore"), &["-w", "5", "--noflush"], Some(&input)) {
                errors.push(err.to_string());
            }
        }
    }
    if errors.is_empty() { Ok(()) } else { Err(Error::Iptables(errors.join("; "))) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flavour_follows_hints_then_kube_rules_then_rule_counts() {
        let none = FlavourEvidence::default();
        assert_eq!(choose_flavour(none, none), Flavour::Nft);
        let hinted = FlavourEvidence { hint: true, ..none };
        assert_eq!(choose_flavour(hinted, none), Flavour::Legacy);
        let kube = FlavourEvidence { kube_rules: 3, rules: 3, hint: false };
        let busy = FlavourEvidence { kube_rules: 0, rules: 40, hint: false };
        assert_eq!(choose_flavour(kube, busy), Flavour::Legacy);
        assert_eq!(choose_flavour(busy, none), Flavour::Legacy);
        assert_eq!(choose_flavour(none, busy), Flavour::Nft);
        let listing =
            "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n*nat\n-A PREROUTING -j KUBE-SERVICES\n-A X -j Y\nCOMMIT\n";
        assert_eq!(FlavourEvidence::of(listing), FlavourEvidence { hint: true, kube_rules: 1, rules: 2 });
    }

    /// iptables 1.8.9's own messages, captured for a bad rule and for a run without
    /// CAP_NET_ADMIN, in both flavours.
    #[test]
    fn restore_errors_blame_the_input_only_for_bad_lines() {
        let legacy_bad = "iptables-restore v1.8.9 (legacy): Couldn't load target `NOPE':No such file or directory\n\n\
                          Error occurred at line: 3";
        let nft_bad = "iptables-nft-restore v1.8.9 (nf_tables): Chain 'NOPE' does not exist\nError occurred at line: 4";
        let legacy_perm = "iptables-restore v1.8.9 (legacy): iptables-restore: unable to initialize table 'filter'\n\
                           Error occurred at line: 1";
        let nft_perm = "iptables-nft-restore v1.8.9 (nf_tables): Could not fetch rule set generation id: \
                        Permission denied (you must be root)";
        let lock = "Another app is currently holding the xtables lock. Stopped waiting after 5s.";
        assert!(blames_the_input(legacy_bad) && blames_the_input(nft_bad));
        for other in [legacy_perm, nft_perm, lock] {
            assert!(!blames_the_input(other), "{other}");
        }
        let failed = |stderr: &str| ToolError::Failed { code: Some(2), stderr: stderr.into() };
        assert!(tool_error("iptables-restore", &[], failed(nft_bad)).is_refusal());
        assert!(!tool_error("iptables-restore", &[], failed(legacy_perm)).is_refusal());
        assert!(!tool_error("iptables-save", &[], failed(nft_bad)).is_refusal());
    }
}
