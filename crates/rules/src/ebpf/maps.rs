//! The BPF maps of eBPF mode as the planner lays them out from an [`EbpfPlan`], and the ordered
//! map updates that go from one layout to the next.
//!
//! - `services`: a frontend's slot 0 is its master entry (how many backends, its identifier,
//!   what to do without one); slots `1..=count` name its backends. A program picks slot
//!   `1 + hash % count` (or reads the Maglev table), so an endpoint change rewrites a few slots
//!   and the master entry, whatever the cluster's size.
//! - `backends`: identifier -> endpoint address, shared by every frontend that sends there.
//! - `rev_nat`: a frontend's identifier -> its address, which `recvmsg`/`getpeername` and reply
//!   translation put back.
//! - `maglev`: a frontend's identifier -> its table of backend identifiers.
//! - `source_ranges`: (frontend identifier, CIDR) pairs a source must match when the frontend's
//!   master entry says it has ranges.
//!
//! Identifiers and slots are kept from the previous layout (read back from the kernel after a
//! restart), so a proxy adopts what it finds and an unchanged Service costs no update.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use super::maglev;
use super::plan::{ANY_PORT, BackendAddress, EbpfPlan, Empty, Frontend, FrontendKey, Selection};
use crate::table::{Protocol, ServicePortName};

/// A frontend's identifier (Cilium's reverse-NAT index); 0 is never used.
pub type FrontendId = u16;
/// A backend's identifier; 0 is never used.
pub type BackendId = u32;

/// A frontend's address, port and protocol: what its identifier stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct FrontendAddress(IpAddr, u16, Protocol);

impl FrontendAddress {
    fn of(key: &FrontendKey) -> FrontendAddress {
        FrontendAddress(key.address, key.port, key.protocol)
    }
}

/// How large the maps are (flags with documented defaults), and the Maglev table size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapLimits {
    /// Entries of `services`: every frontend's master entry and backend slots.
    pub services: usize,
    /// Entries of `backends`.
    pub backends: usize,
    /// Frontend identifiers (entries of `rev_nat`), at most `u16::MAX`.
    pub frontends: usize,
    /// Slots of each Maglev table (a prime of [`maglev::TABLE_SIZES`]); a frontend balanced by
    /// Maglev may have at most a hundredth as many backends.
    pub maglev_table_size: u32,
    /// Entries of `source_ranges`: the `loadBalancerSourceRanges` of every frontend together.
    pub source_ranges: usize,
}

impl Default for MapLimits {
    /// Cilium's defaults: 64k service entries and backends, 16381 Maglev slots; 16k source ranges.
    fn default() -> MapLimits {
        MapLimits {
            services: 65536,
            backends: 65536,
            frontends: 65535,
            maglev_table_size: maglev::DEFAULT_TABLE_SIZE,
            source_ranges: 16384,
        }
    }
}

/// A `services` key: a frontend and a slot (0: the master entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlotKey {
    /// The frontend.
    pub frontend: FrontendKey,
    /// 0 for the master entry, `1..=count` for a backend.
    pub slot: u16,
}

/// A frontend's master entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Master {
    /// Its identifier (`rev_nat`, `maglev`, `source_ranges`).
    pub id: FrontendId,
    /// How many backend slots follow.
    pub count: u16,
    /// Random or Maglev.
    pub selection: Selection,
    /// Reject or drop without a backend.
    pub empty: Empty,
    /// Session affinity timeout in seconds (0: none).
    pub affinity: u32,
    /// Whether `source_ranges` holds ranges for it.
    pub source_ranges: bool,
    /// Whether translated traffic is masqueraded.
    pub masquerade: bool,
}

/// A `services` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SlotValue {
    /// Slot 0.
    Master(Master),
    /// A backend slot.
    Backend(BackendId),
}

/// What the maps hold: eBPF mode's kernel side.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Maps {
    /// Master entries and backend slots.
    pub services: BTreeMap<SlotKey, SlotValue>,
    /// Backend identifiers.
    pub backends: BTreeMap<BackendId, BackendAddress>,
    /// Frontend identifiers and the address they stand for.
    pub rev_nat: BTreeMap<FrontendId, (IpAddr, u16)>,
    /// Maglev tables by frontend identifier.
    pub maglev: BTreeMap<FrontendId, Vec<BackendId>>,
    /// Source ranges by frontend identifier.
    pub source_ranges: BTreeSet<(FrontendId, IpNet)>,
}

/// One map update, in the order [`Maps::diff`] gives them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapOp {
    /// Insert or replace a `backends` entry.
    SetBackend(BackendId, BackendAddress),
    /// Insert or replace a `rev_nat` entry.
    SetRevNat(FrontendId, (IpAddr, u16)),
    /// Insert or replace a Maglev table (one value: readers see the old table or the new one).
    SetMaglev(FrontendId, Vec<BackendId>),
    /// Insert a source range.
    AddSourceRange(FrontendId, IpNet),
    /// Insert or replace a `services` entry.
    SetSlot(SlotKey, SlotValue),
    /// Delete a `services` entry.
    DeleteSlot(SlotKey),
    /// Delete a source range.
    DeleteSourceRange(FrontendId, IpNet),
    /// Delete a Maglev table.
    DeleteMaglev(FrontendId),
    /// Delete a `rev_nat` entry.
    DeleteRevNat(FrontendId),
    /// Delete a `backends` entry.
    DeleteBackend(BackendId),
}

/// A Service port the maps cannot hold, left as the maps held it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The Service port.
    pub service: ServicePortName,
    /// Why, naming the limit.
    pub reason: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Service {}: {}", self.service, self.reason)
    }
}

impl Maps {
    /// Applies one update, as the kernel would: the model a fake loader and the tests keep.
    pub fn apply(&mut self, op: &MapOp) {
        match op {
            MapOp::SetBackend(id, address) => drop(self.backends.insert(*id, *address)),
            MapOp::SetRevNat(id, address) => drop(self.rev_nat.insert(*id, *address)),
            MapOp::SetMaglev(id, table) => drop(self.maglev.insert(*id, table.clone())),
            MapOp::AddSourceRange(id, net) => drop(self.source_ranges.insert((*id, *net))),
            MapOp::SetSlot(key, value) => drop(self.services.insert(*key, *value)),
            MapOp::DeleteSlot(key) => drop(self.services.remove(key)),
            MapOp::DeleteSourceRange(id, net) => drop(self.source_ranges.remove(&(*id, *net))),
            MapOp::DeleteMaglev(id) => drop(self.maglev.remove(id)),
            MapOp::DeleteRevNat(id) => drop(self.rev_nat.remove(id)),
            MapOp::DeleteBackend(id) => drop(self.backends.remove(id)),
        }
    }

    /// The backend slots of `frontend`, in slot order.
    pub fn slots(&self, frontend: &FrontendKey) -> Vec<BackendId> {
        self.entries(frontend)
            .filter_map(|(_, value)| match value {
                SlotValue::Backend(id) => Some(*id),
                SlotValue::Master(_) => None,
            })
            .collect()
    }

    /// The master entry of `frontend`.
    pub fn master(&self, frontend: &FrontendKey) -> Option<&Master> {
        match self.services.get(&SlotKey { frontend: *frontend, slot: 0 }) {
            Some(SlotValue::Master(master)) => Some(master),
            _ => None,
        }
    }

    /// Every `services` entry of `frontend`, master first.
    fn entries(&self, frontend: &FrontendKey) -> impl Iterator<Item = (&SlotKey, &SlotValue)> {
        let master = SlotKey { frontend: *frontend, slot: 0 };
        self.services.range(master..).take_while(move |(key, _)| key.frontend == *frontend)
    }

    /// The source ranges of frontend `id` (a range query: O(its ranges), not O(every range)).
    fn ranges_of(&self, id: FrontendId) -> impl Iterator<Item = (FrontendId, IpNet)> + '_ {
        let lowest = IpNet::V4(ipnet::Ipv4Net::default());
        self.source_ranges.range((id, lowest)..).take_while(move |(of, _)| *of == id).copied()
    }

    /// What the maps hold for `frontends`: their entries and everything those reference.
    fn restricted<'a>(&self, frontends: impl IntoIterator<Item = &'a FrontendKey>) -> Maps {
        let mut sub = Maps::default();
        for frontend in frontends {
            sub.services.extend(self.entries(frontend).map(|(k, v)| (*k, *v)));
            for id in self.slots(frontend) {
                sub.backends.extend(self.backends.get(&id).map(|address| (id, *address)));
            }
            let Some(master) = self.master(frontend) else { continue };
            sub.rev_nat.extend(self.rev_nat.get(&master.id).map(|address| (master.id, *address)));
            sub.maglev.extend(self.maglev.get(&master.id).map(|table| (master.id, table.clone())));
            sub.source_ranges.extend(self.ranges_of(master.id));
        }
        sub
    }

    /// The map updates from `self` to `next`, ordered so that no program ever reads a half-built
    /// frontend: what is referenced is written before what references it (backends, reverse
    /// addresses, Maglev tables and source ranges, then a frontend's slots, then its master
    /// entry), and what is no longer referenced is deleted after (a gone frontend's master entry
    /// before its slots, then the tables it used, the backends last). A frontend whose backends
    /// shrink gets its last backends moved into the freed slots first, then its count, then the
    /// slots past it are deleted: every slot below the count names a live backend throughout.
    pub fn diff(&self, next: &Maps) -> Vec<MapOp> {
        let mut ops = Vec::new();
        ops.extend(upserts(&self.backends, &next.backends).map(|(id, b)| MapOp::SetBackend(*id, *b)));
        ops.extend(upserts(&self.rev_nat, &next.rev_nat).map(|(id, a)| MapOp::SetRevNat(*id, *a)));
        ops.extend(upserts(&self.maglev, &next.maglev).map(|(id, t)| MapOp::SetMaglev(*id, t.clone())));
        ops.extend(
            next.source_ranges.difference(&self.source_ranges).map(|(id, net)| MapOp::AddSourceRange(*id, *net)),
        );
        let frontends: BTreeSet<FrontendKey> =
            self.services.keys().chain(next.services.keys()).map(|key| key.frontend).collect();
        for frontend in &frontends {
            let master = SlotKey { frontend: *frontend, slot: 0 };
            let (old, new) = (self.services.get(&master), next.services.get(&master));
            if new.is_none() && old.is_some() {
                ops.push(MapOp::DeleteSlot(master));
            }
            for (key, value) in next.entries(frontend).filter(|(k, _)| k.slot != 0) {
                if self.services.get(key) != Some(value) {
                    ops.push(MapOp::SetSlot(*key, *value));
                }
            }
            if let Some(value) = new.filter(|value| old != Some(value)) {
                ops.push(MapOp::SetSlot(master, *value));
            }
            let gone = self.entries(frontend).filter(|(k, _)| k.slot != 0 && !next.services.contains_key(k));
            ops.extend(gone.map(|(k, _)| MapOp::DeleteSlot(*k)));
        }
        ops.extend(
            self.source_ranges.difference(&next.source_ranges).map(|(id, net)| MapOp::DeleteSourceRange(*id, *net)),
        );
        ops.extend(removals(&self.maglev, &next.maglev).map(MapOp::DeleteMaglev));
        ops.extend(removals(&self.rev_nat, &next.rev_nat).map(MapOp::DeleteRevNat));
        ops.extend(removals(&self.backends, &next.backends).map(MapOp::DeleteBackend));
        ops
    }
}

/// The entries of `new` that `old` lacks or holds with another value.
fn upserts<'a, K: Ord, V: PartialEq>(
    old: &'a BTreeMap<K, V>,
    new: &'a BTreeMap<K, V>,
) -> impl Iterator<Item = (&'a K, &'a V)> {
    new.iter().filter(move |(key, value)| old.get(key) != Some(value))
}

/// The keys of `old` that `new` lacks.
fn removals<'a, K: Ord + Copy, V>(old: &'a BTreeMap<K, V>, new: &'a BTreeMap<K, V>) -> impl Iterator<Item = K> + 'a {
    old.keys().filter(move |key| !new.contains_key(key)).copied()
}

/// The maps and the indexes that lay a Service out in them in O(that Service): identifiers by
/// address, how many slots and master entries use each identifier, and each Service port's
/// frontends. [`Layout::set`] is a partial sync's step, [`Layout::sweep`] ends a full one.
#[derive(Debug, Clone, Default)]
pub struct Layout {
    maps: Maps,
    backend_ids: BTreeMap<BackendAddress, BackendId>,
    /// Each allocated backend identifier's address and how many slots name it.
    backend_refs: BTreeMap<BackendId, (BackendAddress, usize)>,
    frontend_ids: BTreeMap<FrontendAddress, FrontendId>,
    /// Each allocated frontend identifier's address and how many master entries use it (both
    /// scopes of an address share one).
    frontend_refs: BTreeMap<FrontendId, (FrontendAddress, usize)>,
    frontends_of: BTreeMap<ServicePortName, BTreeSet<FrontendKey>>,
    /// Each frontend's Service port (the reverse of `frontends_of`): a port that takes a
    /// frontend over takes it out of its former owner's set, whose removal must not delete it.
    owner_of: BTreeMap<FrontendKey, ServicePortName>,
    /// Where the search for a free identifier starts.
    next_backend: u64,
    next_frontend: u64,
}

impl Layout {
    /// Takes over what the kernel's maps hold (read back after a restart, or empty): identifiers
    /// and slots are kept, so that re-setting an unchanged Service writes nothing. Which Service
    /// owns a frontend is not in the maps: a full sync sets every Service, then [`Layout::sweep`]
    /// deletes what none of them claimed.
    pub fn adopt(found: Maps) -> Layout {
        let mut layout = Layout { next_backend: 1, next_frontend: 1, ..Layout::default() };
        for (id, address) in &found.backends {
            layout.backend_ids.insert(*address, *id);
            layout.backend_refs.insert(*id, (*address, 0));
        }
        for (key, value) in &found.services {
            match value {
                // A slot naming no backend the map holds is rewritten when its Service is set.
                SlotValue::Backend(id) => layout.backend_refs.get_mut(id).into_iter().for_each(|(_, refs)| *refs += 1),
                SlotValue::Master(master) if master.id != 0 => {
                    let address = FrontendAddress::of(&key.frontend);
                    layout.frontend_ids.insert(address, master.id);
                    layout.frontend_refs.entry(master.id).or_insert((address, 0)).1 += 1;
                }
                // A catch-all: no identifier.
                SlotValue::Master(_) => {}
            }
        }
        layout.maps = found;
        layout
    }

    /// What the maps hold.
    pub fn maps(&self) -> &Maps {
        &self.maps
    }

    /// A full sync: sets every Service port of `plan`, then sweeps what none claimed. The map
    /// updates in order, and the Service ports refused (each keeps what it had).
    pub fn sync(&mut self, plan: &EbpfPlan, limits: &MapLimits) -> (Vec<MapOp>, Vec<Refusal>) {
        let (mut ops, mut refusals) = (Vec::new(), Vec::new());
        let mut by_service: BTreeMap<&ServicePortName, Vec<(&FrontendKey, &Frontend)>> = BTreeMap::new();
        for (key, frontend) in &plan.frontends {
            by_service.entry(&frontend.service).or_default().push((key, frontend));
        }
        let gone: Vec<ServicePortName> =
            self.frontends_of.keys().filter(|service| !by_service.contains_key(service)).cloned().collect();
        for service in &gone {
            ops.extend(self.set(service, &[], limits).expect("removing a Service needs no room"));
        }
        for (service, frontends) in by_service {
            match self.set(service, &frontends, limits) {
                Ok(set) => ops.extend(set),
                Err(refusal) => refusals.push(refusal),
            }
        }
        ops.extend(self.sweep());
        (ops, refusals)
    }

    /// Lays out Service port `service` with `frontends` (none: it is gone), replacing what it
    /// had, and returns the map updates that do it in a safe order ([`Maps::diff`]). A Service
    /// the maps cannot hold is refused and keeps what it had.
    pub fn set(
        &mut self,
        service: &ServicePortName,
        frontends: &[(&FrontendKey, &Frontend)],
        limits: &MapLimits,
    ) -> Result<Vec<MapOp>, Refusal> {
        let refuse = |reason: String| Refusal { service: service.clone(), reason };
        let mut old_keys = self.frontends_of.get(service).cloned().unwrap_or_default();
        old_keys.extend(frontends.iter().map(|(key, _)| **key).filter(|key| self.maps.master(key).is_some()));
        let old = self.maps.restricted(&old_keys);
        let laid_out = self.lay_out(frontends, limits).and_then(|new| match self.overflow(&old, &new, limits) {
            None => Ok(new),
            Some(reason) => {
                self.release(&new, &old);
                Err(reason)
            }
        });
        let new = match laid_out {
            Ok(new) => new,
            Err(reason) => {
                // What it had stays, its own (a sweep must not take adopted entries).
                self.own(service, old_keys);
                return Err(refuse(reason));
            }
        };
        let mut ops = old.diff(&new);
        self.count(&old, &new);
        ops.retain(|op| match op {
            MapOp::SetBackend(id, address) => self.maps.backends.get(id) != Some(address),
            MapOp::DeleteBackend(id) => !self.backend_refs.contains_key(id),
            MapOp::DeleteRevNat(id) | MapOp::DeleteMaglev(id) => !self.frontend_refs.contains_key(id),
            _ => true,
        });
        self.store(&old, &new);
        let keys: BTreeSet<FrontendKey> = frontends.iter().map(|(key, _)| **key).collect();
        self.own(service, keys);
        Ok(ops)
    }

    /// Why the maps cannot hold `new` in place of `old`, if a map would outgrow its size. A
    /// Service that shrinks a map is never refused for it: it frees room.
    fn overflow(&self, old: &Maps, new: &Maps, limits: &MapLimits) -> Option<String> {
        let outgrows = |held: usize, old: usize, new: usize, size: usize, map: &str| {
            let entries = held - old + new;
            (entries > size && new > old)
                .then(|| format!("the {map} map would need {entries} entries and holds {size}"))
        };
        let services = (self.maps.services.len(), old.services.len(), new.services.len());
        let ranges = (self.maps.source_ranges.len(), old.source_ranges.len(), new.source_ranges.len());
        outgrows(services.0, services.1, services.2, limits.services, "services")
            .map(|reason| reason + " (raise its size)")
            .or_else(|| outgrows(ranges.0, ranges.1, ranges.2, limits.source_ranges, "source_ranges"))
    }

    /// Records `keys` as `service`'s frontends, taking each out of a former owner's set, and
    /// forgets those it no longer has.
    fn own(&mut self, service: &ServicePortName, keys: BTreeSet<FrontendKey>) {
        for key in &keys {
            match self.owner_of.insert(*key, service.clone()) {
                Some(former) if former != *service => {
                    if let Some(theirs) = self.frontends_of.get_mut(&former) {
                        theirs.remove(key);
                        if theirs.is_empty() {
                            self.frontends_of.remove(&former);
                        }
                    }
                }
                _ => {}
            }
        }
        let before = if keys.is_empty() {
            self.frontends_of.remove(service)
        } else {
            self.frontends_of.insert(service.clone(), keys.clone())
        };
        for key in before.unwrap_or_default().difference(&keys) {
            if self.owner_of.get(key) == Some(service) {
                self.owner_of.remove(key);
            }
        }
    }

    /// Deletes every frontend no Service port was set with, and what only they used, and what
    /// nothing references (a crashed run's): the end of a full sync over adopted maps.
    pub fn sweep(&mut self) -> Vec<MapOp> {
        let claimed: BTreeSet<&FrontendKey> = self.frontends_of.values().flatten().collect();
        let stale: BTreeSet<FrontendKey> =
            self.maps.services.keys().map(|key| key.frontend).filter(|key| !claimed.contains(key)).collect();
        let old = self.maps.restricted(&stale);
        let mut ops = old.diff(&Maps::default());
        self.count(&old, &Maps::default());
        ops.retain(|op| match op {
            MapOp::DeleteBackend(id) => !self.backend_refs.contains_key(id),
            MapOp::DeleteRevNat(id) | MapOp::DeleteMaglev(id) => !self.frontend_refs.contains_key(id),
            _ => true,
        });
        self.store(&old, &Maps::default());
        let ranges: Vec<(FrontendId, IpNet)> =
            self.maps.source_ranges.iter().filter(|(id, _)| !self.frontend_refs.contains_key(id)).copied().collect();
        ops.extend(ranges.iter().map(|(id, net)| MapOp::DeleteSourceRange(*id, *net)));
        let maglev: Vec<FrontendId> =
            self.maps.maglev.keys().filter(|id| !self.frontend_refs.contains_key(id)).copied().collect();
        ops.extend(maglev.iter().map(|id| MapOp::DeleteMaglev(*id)));
        let rev_nat: Vec<FrontendId> =
            self.maps.rev_nat.keys().filter(|id| !self.frontend_refs.contains_key(id)).copied().collect();
        ops.extend(rev_nat.iter().map(|id| MapOp::DeleteRevNat(*id)));
        let unused = |id: &BackendId| self.backend_refs.get(id).is_none_or(|(_, refs)| *refs == 0);
        let backends: Vec<BackendId> = self.maps.backends.keys().filter(|id| unused(id)).copied().collect();
        ops.extend(backends.iter().map(|id| MapOp::DeleteBackend(*id)));
        for (id, net) in &ranges {
            self.maps.source_ranges.remove(&(*id, *net));
        }
        for id in &maglev {
            self.maps.maglev.remove(id);
        }
        for id in &rev_nat {
            self.maps.rev_nat.remove(id);
        }
        for id in &backends {
            self.maps.backends.remove(id);
            if let Some((address, _)) = self.backend_refs.remove(id) {
                self.backend_ids.remove(&address);
            }
        }
        ops
    }

    /// The layout of `frontends` on the identifiers and slots the maps hold; new identifiers are
    /// allocated (and released again if it fails).
    fn lay_out(&mut self, frontends: &[(&FrontendKey, &Frontend)], limits: &MapLimits) -> Result<Maps, String> {
        let max_maglev = limits.maglev_table_size as usize / 100;
        if let Some((key, frontend)) =
            frontends.iter().find(|(_, f)| f.selection == Selection::Maglev && f.backends.len() > max_maglev)
        {
            return Err(format!(
                "frontend {key} has {} endpoints, more than the {max_maglev} a Maglev table of {} slots balances \
                 (raise the table size)",
                frontend.backends.len(),
                limits.maglev_table_size
            ));
        }
        let mut new = Maps::default();
        for (key, frontend) in frontends {
            if let Err(reason) = self.lay_out_frontend(key, frontend, limits, &mut new) {
                self.release(&new, &Maps::default());
                return Err(reason);
            }
        }
        Ok(new)
    }

    /// Adds one frontend's entries to `new`.
    fn lay_out_frontend(
        &mut self,
        key: &FrontendKey,
        frontend: &Frontend,
        limits: &MapLimits,
        new: &mut Maps,
    ) -> Result<(), String> {
        // A ClusterIP's catch-all is never translated: it needs no identifier (0).
        let id = if key.port == ANY_PORT { 0 } else { self.frontend_id(key, limits)? };
        if id != 0 {
            new.rev_nat.insert(id, (key.address, key.port));
        }
        let mut wanted = Vec::with_capacity(frontend.backends.len());
        for backend in &frontend.backends {
            let backend_id = self.backend_id(backend, limits)?;
            new.backends.insert(backend_id, *backend);
            wanted.push(backend_id);
        }
        let slots = keep_slots(&self.maps.slots(key), &wanted);
        let count = u16::try_from(slots.len()).map_err(|_| format!("frontend {key} has more than 65535 endpoints"))?;
        let master = Master {
            id,
            count,
            selection: frontend.selection,
            empty: frontend.empty,
            affinity: frontend.affinity.unwrap_or(0),
            source_ranges: !frontend.source_ranges.is_empty(),
            masquerade: frontend.masquerade,
        };
        new.services.insert(SlotKey { frontend: *key, slot: 0 }, SlotValue::Master(master));
        for (slot, backend) in (1..).zip(&slots) {
            new.services.insert(SlotKey { frontend: *key, slot }, SlotValue::Backend(*backend));
        }
        if frontend.selection == Selection::Maglev && !slots.is_empty() {
            let name = |id: &BackendId| new.backends[id].to_string();
            let table = maglev::table(&slots, limits.maglev_table_size, name);
            new.maglev.insert(id, table.into_iter().map(|i| slots[i]).collect());
        }
        new.source_ranges.extend(frontend.source_ranges.iter().map(|net| (id, *net)));
        Ok(())
    }

    /// The backend's identifier: the one it has, else the next free one.
    fn backend_id(&mut self, backend: &BackendAddress, limits: &MapLimits) -> Result<BackendId, String> {
        if let Some(id) = self.backend_ids.get(backend) {
            return Ok(*id);
        }
        if self.backend_refs.len() >= limits.backends {
            return Err(format!("the backends map is full ({} entries; raise its size)", limits.backends));
        }
        let refs = &self.backend_refs;
        let id = next_free(&mut self.next_backend, |id| refs.contains_key(&(id as BackendId)), BackendId::MAX.into());
        let id = id as BackendId;
        self.backend_ids.insert(*backend, id);
        self.backend_refs.insert(id, (*backend, 0));
        Ok(id)
    }

    /// The frontend's identifier: the one its address has, else the next free one.
    fn frontend_id(&mut self, key: &FrontendKey, limits: &MapLimits) -> Result<FrontendId, String> {
        let address = FrontendAddress::of(key);
        if let Some(id) = self.frontend_ids.get(&address) {
            return Ok(*id);
        }
        if self.frontend_refs.len() >= limits.frontends.min(usize::from(FrontendId::MAX)) {
            return Err(format!("every frontend identifier is taken ({}; raise the limit)", self.frontend_refs.len()));
        }
        let refs = &self.frontend_refs;
        let id =
            next_free(&mut self.next_frontend, |id| refs.contains_key(&(id as FrontendId)), FrontendId::MAX.into());
        let id = id as FrontendId;
        self.frontend_ids.insert(address, id);
        self.frontend_refs.insert(id, (address, 0));
        Ok(id)
    }

    /// Moves the reference counts from layout `old` to `new`, forgetting the identifiers no slot
    /// or master entry uses any more.
    fn count(&mut self, old: &Maps, new: &Maps) {
        // `new` names only allocated identifiers; `old` what the maps hold, which may name a
        // backend they lack (adopted as found).
        for (value, delta) in new.services.values().map(|v| (v, 1)).chain(old.services.values().map(|v| (v, -1))) {
            let refs = match value {
                SlotValue::Backend(id) => self.backend_refs.get_mut(id).map(|(_, refs)| refs),
                SlotValue::Master(master) => self.frontend_refs.get_mut(&master.id).map(|(_, refs)| refs),
            };
            if let Some(refs) = refs {
                *refs = refs.saturating_add_signed(delta);
            }
        }
        self.release(new, old);
    }

    /// Forgets the identifiers `new` or `old` mention that nothing references.
    fn release(&mut self, new: &Maps, old: &Maps) {
        for id in new.backends.keys().chain(old.backends.keys()) {
            if let Some(&(address, 0)) = self.backend_refs.get(id) {
                self.backend_refs.remove(id);
                self.backend_ids.remove(&address);
            }
        }
        for id in new.rev_nat.keys().chain(old.rev_nat.keys()) {
            if let Some(&(address, 0)) = self.frontend_refs.get(id) {
                self.frontend_refs.remove(id);
                self.frontend_ids.remove(&address);
            }
        }
    }

    /// Replaces `old`'s entries in the maps with `new`'s (shared backends and identifiers stay
    /// while referenced).
    fn store(&mut self, old: &Maps, new: &Maps) {
        for key in old.services.keys() {
            self.maps.services.remove(key);
        }
        for range in &old.source_ranges {
            self.maps.source_ranges.remove(range);
        }
        for id in old.backends.keys().filter(|id| !self.backend_refs.contains_key(id)) {
            self.maps.backends.remove(id);
        }
        for id in old.rev_nat.keys().chain(old.maglev.keys()).filter(|id| !self.frontend_refs.contains_key(id)) {
            self.maps.rev_nat.remove(id);
            self.maps.maglev.remove(id);
        }
        self.maps.services.extend(new.services.iter().map(|(k, v)| (*k, *v)));
        self.maps.backends.extend(new.backends.iter().map(|(k, v)| (*k, *v)));
        self.maps.rev_nat.extend(new.rev_nat.iter().map(|(k, v)| (*k, *v)));
        self.maps.maglev.extend(new.maglev.iter().map(|(k, v)| (*k, v.clone())));
        self.maps.source_ranges.extend(new.source_ranges.iter().copied());
    }
}

/// The next identifier from `cursor` up (wrapping from `max` to 1) for which `used` is false;
/// the caller has checked that one is free.
fn next_free(cursor: &mut u64, used: impl Fn(u64) -> bool, max: u64) -> u64 {
    let step = |id: u64| if id >= max { 1 } else { id + 1 };
    let mut id = (*cursor).max(1);
    while used(id) {
        id = step(id);
    }
    *cursor = step(id);
    id
}

/// The slots of a frontend going from backends `previous` (in slot order) to `wanted`: a backend
/// that stays keeps its slot, new backends fill the freed slots and then go at the end, and
/// freed slots still left are filled with the last backends, so the slots stay `1..=n`.
fn keep_slots(previous: &[BackendId], wanted: &[BackendId]) -> Vec<BackendId> {
    let wanted_set: BTreeSet<BackendId> = wanted.iter().copied().collect();
    let mut slots: Vec<Option<BackendId>> =
        previous.iter().map(|id| Some(*id).filter(|id| wanted_set.contains(id))).collect();
    let kept: BTreeSet<BackendId> = slots.iter().flatten().copied().collect();
    let mut new = wanted.iter().filter(|id| !kept.contains(id)).copied();
    for slot in slots.iter_mut().filter(|slot| slot.is_none()) {
        *slot = new.next();
    }
    slots.extend(new.map(Some));
    while let Some(hole) = slots.iter().position(Option::is_none) {
        // The last slot fills the lowest hole (or was the hole).
        if let Some(last) = slots.pop().flatten() {
            slots[hole] = Some(last);
        }
    }
    slots.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ebpf::plan::tests::{cfg, ep, node, port};
    use crate::table::{Endpoint, ServicePort};

    fn plan(ports: &[&ServicePort]) -> EbpfPlan {
        EbpfPlan::new(&cfg(), &node(), ports.iter().copied())
    }

    fn endpoints(hosts: &[u8]) -> Vec<Endpoint> {
        hosts.iter().map(|h| ep(&format!("10.244.0.{h}"), true)).collect()
    }

    fn limits() -> MapLimits {
        MapLimits { maglev_table_size: 1021, ..MapLimits::default() }
    }

    /// What a program may read at any moment: every master's slots `1..=count` name backends
    /// the map holds, its identifier has its reverse address, a Maglev master has a table of
    /// held backends, and a master with source ranges has them.
    fn assert_readable(maps: &Maps, after: &str) {
        for (key, value) in &maps.services {
            let SlotValue::Master(master) = value else { continue };
            for slot in 1..=master.count {
                let at = SlotKey { frontend: key.frontend, slot };
                match maps.services.get(&at) {
                    Some(SlotValue::Backend(id)) => {
                        assert!(
                            maps.backends.contains_key(id),
                            "{} slot {slot}: backend {id} gone, after {after}",
                            key.frontend
                        )
                    }
                    other => panic!("{} slot {slot} of {}: {other:?}, after {after}", key.frontend, master.count),
                }
            }
            let catch_all = key.frontend.port == ANY_PORT && master.id == 0 && master.count == 0;
            assert!(
                catch_all || maps.rev_nat.contains_key(&master.id),
                "{}: no rev_nat {}, after {after}",
                key.frontend,
                master.id
            );
            if master.selection == Selection::Maglev && master.count > 0 {
                let table = maps
                    .maglev
                    .get(&master.id)
                    .unwrap_or_else(|| panic!("{}: no Maglev table, after {after}", key.frontend));
                assert!(
                    table.iter().all(|id| maps.backends.contains_key(id)),
                    "{}: Maglev names a gone backend, after {after}",
                    key.frontend
                );
            }
            if master.source_ranges {
                assert!(
                    maps.source_ranges.iter().any(|(id, _)| *id == master.id),
                    "{}: ranges gone, after {after}",
                    key.frontend
                );
            }
        }
    }

    /// Applies `ops` one by one to `kernel`, checking it stays readable, and that it ends as the
    /// layout says.
    fn apply_checked(kernel: &mut Maps, ops: &[MapOp], layout: &Layout) {
        for op in ops {
            kernel.apply(op);
            assert_readable(kernel, &format!("{op:?}"));
        }
        assert_eq!(kernel, layout.maps(), "the kernel ends as the layout");
    }

    fn set(layout: &mut Layout, kernel: &mut Maps, p: &ServicePort) -> Vec<MapOp> {
        let planned = plan(&[p]);
        let frontends: Vec<(&FrontendKey, &Frontend)> = planned.frontends.iter().collect();
        let ops = layout.set(&p.name, &frontends, &limits()).expect("fits");
        apply_checked(kernel, &ops, layout);
        ops
    }

    #[test]
    fn a_frontend_taken_over_stays_with_its_new_owner_when_the_old_one_is_removed_after() {
        let (mut layout, mut kernel) = (Layout::adopt(Maps::default()), Maps::default());
        let mut old = port("old", "10.96.0.81", endpoints(&[11]));
        old.external_ips = vec!["203.0.113.7".parse().unwrap()];
        set(&mut layout, &mut kernel, &old);
        // old is deleted: new, next by name, claims the externalIP in the same partial sync,
        // before old's removal is laid out.
        let mut new = port("new", "10.96.0.82", endpoints(&[12]));
        new.external_ips = old.external_ips.clone();
        set(&mut layout, &mut kernel, &new);
        let removed = layout.set(&old.name, &[], &limits()).expect("removal");
        apply_checked(&mut kernel, &removed, &layout);
        let shared = FrontendKey {
            address: "203.0.113.7".parse().unwrap(),
            port: 80,
            protocol: Protocol::Tcp,
            scope: super::super::plan::Scope::Internal,
        };
        let backends: Vec<String> = kernel.slots(&shared).iter().map(|id| kernel.backends[id].to_string()).collect();
        assert_eq!(backends, ["10.244.0.12:8080"], "new keeps it: {removed:?}");
    }

    #[test]
    fn a_new_service_is_written_backends_first_and_its_master_entry_last() {
        let mut layout = Layout::adopt(Maps::default());
        let ops = set(&mut layout, &mut Maps::default(), &port("a", "10.96.0.10", endpoints(&[11, 12])));
        let kinds: Vec<&str> = ops
            .iter()
            .map(|op| match op {
                MapOp::SetBackend(..) => "backend",
                MapOp::SetRevNat(..) => "rev_nat",
                MapOp::SetSlot(key, _) if key.slot == 0 => "master",
                MapOp::SetSlot(..) => "slot",
                other => panic!("{other:?}"),
            })
            .collect();
        // The ClusterIP's catch-alls (every other port, three protocols) first: nothing to build.
        assert_eq!(kinds, ["backend", "backend", "rev_nat", "master", "master", "master", "slot", "slot", "master"]);
        let key = *plan(&[&port("a", "10.96.0.10", vec![])]).frontends.keys().find(|k| k.port != ANY_PORT).unwrap();
        assert_eq!(layout.maps().slots(&key), [1, 2]);
        assert_eq!(layout.maps().master(&key).map(|m| (m.id, m.count)), Some((1, 2)));
    }

    #[test]
    fn one_endpoint_joining_or_leaving_is_a_few_updates_and_the_others_keep_their_slots() {
        let (mut layout, mut kernel) = (Layout::adopt(Maps::default()), Maps::default());
        set(&mut layout, &mut kernel, &port("a", "10.96.0.10", endpoints(&[11, 12, 13])));
        let joined = set(&mut layout, &mut kernel, &port("a", "10.96.0.10", endpoints(&[11, 12, 13, 14])));
        assert_eq!(joined.len(), 3, "backend, slot 4, count: {joined:?}");
        let left = set(&mut layout, &mut kernel, &port("a", "10.96.0.10", endpoints(&[11, 13, 14])));
        let key = layout.maps().services.keys().map(|k| k.frontend).find(|k| k.port != ANY_PORT).unwrap();
        assert_eq!(layout.maps().slots(&key), [1, 4, 3], "the last backend moved into the freed slot");
        assert_eq!(
            left,
            [
                MapOp::SetSlot(SlotKey { frontend: key, slot: 2 }, SlotValue::Backend(4)),
                MapOp::SetSlot(
                    SlotKey { frontend: key, slot: 0 },
                    layout.maps().services[&SlotKey { frontend: key, slot: 0 }]
                ),
                MapOp::DeleteSlot(SlotKey { frontend: key, slot: 4 }),
                MapOp::DeleteBackend(2),
            ]
        );
        assert!(
            set(&mut layout, &mut kernel, &port("a", "10.96.0.10", endpoints(&[11, 13, 14]))).is_empty(),
            "unchanged"
        );
    }

    #[test]
    fn churn_never_exposes_a_half_built_frontend() {
        let (mut layout, mut kernel) = (Layout::adopt(Maps::default()), Maps::default());
        let mut lb = port("lb", "10.96.0.20", vec![]);
        lb.node_port = Some(30080);
        lb.load_balancer_ips = vec!["203.0.113.9".parse().unwrap()];
        lb.source_ranges = vec!["198.51.100.0/24".parse().unwrap()];
        let sets: [&[u8]; 7] =
            [&[11, 12, 13], &[11, 12, 13, 14, 15], &[12, 15], &[], &[16], &[11, 12, 13, 14, 15, 16], &[13]];
        for hosts in sets {
            lb.cluster_endpoints = endpoints(hosts);
            set(&mut layout, &mut kernel, &lb);
            set(&mut layout, &mut kernel, &port("a", "10.96.0.10", endpoints(&hosts[..hosts.len().min(2)])));
        }
        let gone: Vec<MapOp> = layout.set(&lb.name, &[], &limits()).unwrap();
        apply_checked(&mut kernel, &gone, &layout);
        assert!(kernel.maglev.is_empty() && kernel.source_ranges.is_empty(), "{kernel:?}");
        assert_eq!(kernel.backends.len(), 1, "only a's backend (10.244.0.13) is left");
    }

    #[test]
    fn a_backend_two_services_share_outlives_one_of_them() {
        let (mut layout, mut kernel) = (Layout::adopt(Maps::default()), Maps::default());
        set(&mut layout, &mut kernel, &port("a", "10.96.0.10", endpoints(&[11])));
        let b = set(&mut layout, &mut kernel, &port("b", "10.96.0.11", endpoints(&[11])));
        assert!(!b.iter().any(|op| matches!(op, MapOp::SetBackend(..))), "shared: {b:?}");
        let gone = layout.set(&port("a", "10.96.0.10", vec![]).name, &[], &limits()).unwrap();
        assert!(!gone.iter().any(|op| matches!(op, MapOp::DeleteBackend(..))), "still b's: {gone:?}");
        apply_checked(&mut kernel, &gone, &layout);
        let name = port("b", "10.96.0.11", vec![]).name;
        let ops = layout.set(&name, &[], &limits()).unwrap();
        assert!(ops.contains(&MapOp::DeleteBackend(1)));
        apply_checked(&mut kernel, &ops, &layout);
        assert_eq!(kernel, Maps::default());
    }

    #[test]
    fn a_restarted_proxy_adopts_what_the_maps_hold_and_sweeps_the_rest() {
        let (a, b) = (port("a", "10.96.0.10", endpoints(&[11, 12])), port("b", "10.96.0.11", endpoints(&[13])));
        let mut first = Layout::adopt(Maps::default());
        let (ops, refused) = first.sync(&plan(&[&a, &b]), &limits());
        assert!(refused.is_empty());
        let mut kernel = Maps::default();
        apply_checked(&mut kernel, &ops, &first);
        // A crashed run left a backend nothing names.
        kernel.backends.insert(99, "10.244.9.9:80".parse().unwrap());

        let mut restarted = Layout::adopt(kernel.clone());
        let (same, _) = restarted.sync(&plan(&[&a, &b]), &limits());
        assert_eq!(same, [MapOp::DeleteBackend(99)], "adopted as they are");
        kernel.apply(&same[0]);
        let mut again = Layout::adopt(kernel.clone());
        let (ops, _) = again.sync(&plan(&[&a]), &limits());
        apply_checked(&mut kernel, &ops, &again);
        assert!(kernel.services.keys().all(|k| k.frontend.address.to_string() == "10.96.0.10"), "b swept");
        assert_eq!(kernel.backends.len(), 2);
    }

    #[test]
    fn a_service_the_maps_cannot_hold_is_refused_and_keeps_what_it_had() {
        let mut big = port("big", "10.96.0.10", endpoints(&[11]));
        big.node_port = Some(30080);
        let small = port("small", "10.96.0.11", endpoints(&[21]));
        let mut layout = Layout::adopt(Maps::default());
        let (ops, refused) = layout.sync(&plan(&[&big, &small]), &limits());
        assert!(refused.is_empty());
        let mut kernel = Maps::default();
        apply_checked(&mut kernel, &ops, &layout);
        let before = kernel.clone();

        big.cluster_endpoints = (1..=3).map(|h| ep(&format!("10.244.1.{h}"), false)).collect();
        let mut tiny = limits();
        tiny.maglev_table_size = 251; // balances 2 backends
        let (ops, refused) = layout.sync(&plan(&[&big, &small]), &tiny);
        assert_eq!(refused.len(), 1);
        let message = refused[0].to_string();
        assert!(message.contains("default/big") && message.contains("Maglev") && message.contains("251"), "{message}");
        assert!(ops.is_empty(), "nothing changes: {ops:?}");
        assert_eq!(layout.maps(), &before);

        // small's 5 entries (3 catch-alls, a master and a slot) and more's 6 do not fit in 10, once
        // big is gone.
        let full = MapLimits { services: 10, ..limits() };
        let more = port("more", "10.96.0.12", endpoints(&[31, 32]));
        let (ops, refused) = layout.sync(&plan(&[&small, &more]), &full);
        assert_eq!(refused.iter().map(|r| r.service.service.name.as_str()).collect::<Vec<_>>(), ["more"]);
        assert!(refused[0].reason.contains("services map"), "{}", refused[0]);
        apply_checked(&mut kernel, &ops, &layout);
        assert!(
            kernel.services.keys().all(|k| k.frontend.address.to_string() == "10.96.0.11"),
            "big gone, more refused"
        );
    }

    #[test]
    fn a_service_whose_source_ranges_do_not_fit_is_refused_and_others_keep_theirs() {
        let lb = |name: &str, ip: &str, ranges: usize| {
            let mut p = port(name, &format!("10.96.0.{ip}"), endpoints(&[11]));
            p.load_balancer_ips = vec![format!("203.0.113.{ip}").parse().unwrap()];
            p.source_ranges = (0..ranges).map(|i| format!("198.51.{i}.0/24").parse().unwrap()).collect();
            p
        };
        let limits = MapLimits { source_ranges: 4, ..limits() };
        let (a, b) = (lb("a", "10", 3), lb("b", "11", 2));
        let mut layout = Layout::adopt(Maps::default());
        let (ops, refused) = layout.sync(&plan(&[&a, &b]), &limits);
        assert_eq!(refused.len(), 1, "3 + 2 ranges do not fit in 4");
        let message = refused[0].to_string();
        assert!(message.contains("default/b") && message.contains("the source_ranges map would need 5"), "{message}");
        let mut kernel = Maps::default();
        apply_checked(&mut kernel, &ops, &layout);
        assert_eq!(kernel.source_ranges.len(), 3, "a's ranges are in, b holds none");
        assert!(kernel.services.keys().all(|k| k.frontend.address.to_string().ends_with(".10")), "b refused whole");

        // a gives up two ranges: b then fits, and a shrinking Service is never refused.
        let a = lb("a", "10", 1);
        let (ops, refused) = layout.sync(&plan(&[&a, &b]), &limits);
        assert!(refused.is_empty(), "{refused:?}");
        apply_checked(&mut kernel, &ops, &layout);
        assert_eq!(kernel.source_ranges.len(), 3);
    }

    #[test]
    fn a_frontends_ranges_are_found_by_range_whatever_their_family() {
        let net = |s: &str| s.parse::<IpNet>().unwrap();
        let mut maps = Maps::default();
        for (id, range) in [(1, "0.0.0.0/0"), (2, "10.0.0.0/8"), (2, "fd00::/8"), (2, "0.0.0.0/0"), (3, "::/0")] {
            maps.source_ranges.insert((id, net(range)));
        }
        let of = |id| maps.ranges_of(id).map(|(_, r)| r.to_string()).collect::<Vec<_>>();
        assert_eq!(of(2), ["0.0.0.0/0", "10.0.0.0/8", "fd00::/8"]);
        assert_eq!((of(1), of(3), of(4)), (vec!["0.0.0.0/0".to_string()], vec!["::/0".to_string()], vec![]));
    }

    #[test]
    fn slots_keep_their_backends_and_stay_dense() {
        assert_eq!(keep_slots(&[], &[5, 6]), [5, 6]);
        assert_eq!(keep_slots(&[5, 6, 7], &[5, 7, 8]), [5, 8, 7], "8 takes 6's slot");
        assert_eq!(keep_slots(&[5, 6, 7, 8], &[6]), [6]);
        assert_eq!(keep_slots(&[5, 6, 7, 8], &[5, 8]), [5, 8]);
        assert_eq!(keep_slots(&[5, 6, 7, 8], &[5, 6]), [5, 6]);
        assert_eq!(keep_slots(&[5, 6], &[]), Vec::<BackendId>::new());
    }

    #[test]
    fn identifiers_are_reused_from_the_lowest_free_and_wrap() {
        let mut cursor = 1;
        let used = [1u64, 2, 4];
        assert_eq!(next_free(&mut cursor, |id| used.contains(&id), 5), 3);
        assert_eq!(next_free(&mut cursor, |id| used.contains(&id), 5), 5);
        assert_eq!(next_free(&mut cursor, |id| used.contains(&id) || id == 5, 5), 3, "wrapped past the maximum");
    }
}
