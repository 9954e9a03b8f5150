//! The thin effectful layer: sends transactions to the kernel and lists the names of what our
//! tables hold.
//!
//! Every sync (full or partial) is one nf_tables netlink batch ([`super::netlink`]), and the
//! listings are netlink dumps of chain and set names, so the proxy never runs `nft` itself; only
//! `roadkeeper cleanup` hands a script to `nft -f`. The `nft` syntax of the same ops stays the
//! reference a reader can replay by hand (`roadkeeper rules`).

use super::netlink::OpStream;
use crate::Error;
use crate::tool::ToolError;
use roadkeeper_rules::nft::objects::Container;
use roadkeeper_rules::nft::rule::Op;
use roadkeeper_rules::nft::transaction::Existing;
use roadkeeper_rules::nft::transaction::script;
use roadkeeper_rules::table::IpFamily;

/// Something that can run nft transactions: the real binary, or a recorder in tests.
pub trait NftRunner: Send {
    /// Applies one script atomically (`nft -f`; cleanup).
    fn apply(&mut self, script: &str) -> Result<(), Error>;
    /// Applies ops atomically, as one transaction (full and partial syncs).
    fn apply_ops(&mut self, ops: &[Op]) -> Result<(), Error>;
    /// Checks ops against the kernel without committing them.
    fn check_ops(&mut self, ops: &[Op]) -> Result<(), Error>;
    /// Applies the ops `ops` emits, as one transaction (full syncs). The kernel's runner encodes
    /// each as it comes, holding no list of them; this default collects them for
    /// [`NftRunner::apply_ops`].
    fn apply_stream(&mut self, ops: OpStream) -> Result<(), Error> {
        let mut all = Vec::new();
        ops(&mut |op| all.push(op.clone()));
        self.apply_ops(&all)
    }
    /// Checks a script against the kernel without committing it (`nft -c`).
    fn check(&mut self, script: &str) -> Result<(), Error>;
    /// Lists the chains and sets currently in our tables (missing tables are empty).
    fn existing(&mut self) -> Result<Existing, Error>;
    /// True when our tables exist and the dispatch rule is in place (detects a flush or delete);
    /// an error when they cannot be read.
    fn healthy(&mut self) -> Result<bool, Error>;
}

/// The kernel: transactions and listings over netlink (transactions on one socket kept open);
/// scripts (cleanup) through `nft -f`.
#[derive(Debug, Default)]
pub struct NftBinary {
    session: super::netlink::Session,
}

fn nft(args: &[&str], stdin: Option<&str>) -> Result<String, Error> {
    crate::tool::run("nft", args, stdin).map_err(|e| match e {
        ToolError::Io(step, e) => Error::Nft(format!("{step} nft: {e}")),
        ToolError::Failed { stderr, .. } => Error::Nft(stderr),
    })
}

impl NftRunner for NftBinary {
    fn apply(&mut self, script: &str) -> Result<(), Error> {
        nft(&["-f", "-"], Some(script)).map(|_| ())
    }

    fn check(&mut self, script: &str) -> Result<(), Error> {
        nft(&["-c", "-f", "-"], Some(script)).map(|_| ())
    }

    fn apply_ops(&mut self, ops: &[Op]) -> Result<(), Error> {
        Ok(self.session.apply(ops)?)
    }

    fn check_ops(&mut self, ops: &[Op]) -> Result<(), Error> {
        Ok(self.session.check(ops)?)
    }

    fn apply_stream(&mut self, ops: OpStream) -> Result<(), Error> {
        Ok(self.session.apply_stream(ops)?)
    }

    fn existing(&mut self) -> Result<Existing, Error> {
        let mut existing = Existing::default();
        for family in [IpFamily::V4, IpFamily::V6] {
            let (chains, sets) = super::netlink::table_names(family)?;
            existing.chains.extend(chains.into_iter().map(|name| (family, name)));
            existing.sets.extend(sets.into_iter().map(|name| (family, name)));
        }
        Ok(existing)
    }

    fn healthy(&mut self) -> Result<bool, Error> {
        for family in [IpFamily::V4, IpFamily::V6] {
            if !super::netlink::chain_uses_set(family, "services", &Container::ServiceIps.name())? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// A runner that applies nothing and remembers the scripts: for `roadkeeper rules` and tests.
#[derive(Debug, Default)]
pub struct Recorder {
    /// Every script passed to `apply`, in order.
    pub scripts: Vec<String>,
}

impl NftRunner for Recorder {
    fn apply(&mut self, script: &str) -> Result<(), Error> {
        self.scripts.push(script.to_string());
        Ok(())
    }

    fn check(&mut self, _script: &str) -> Result<(), Error> {
        Ok(())
    }

    fn apply_ops(&mut self, ops: &[Op]) -> Result<(), Error> {
        self.apply(&script(ops))
    }

    fn check_ops(&mut self, _ops: &[Op]) -> Result<(), Error> {
        Ok(())
    }

    fn existing(&mut self) -> Result<Existing, Error> {
        Ok(Existing::default())
    }

    fn healthy(&mut self) -> Result<bool, Error> {
        Ok(true)
    }
}
