//! eBPF mode's planning (`--proxy-mode ebpf`, in progress): Services without per-packet rules,
//! as Cilium's kube-proxy replacement lays them out. Socket programs translate a frontend to a
//! backend once per connection for traffic that starts on the node; tc programs on the node's
//! interfaces do it per packet for traffic from outside; both read the same BPF maps.
//!
//! [`plan`] is what each frontend should do ([`EbpfPlan`], from the same service table and
//! endpoint selection as the other modes), [`maps`] how the maps lay it out and the ordered map
//! updates from one layout to the next ([`Layout`]: one Service's change costs O(that
//! Service)), [`maglev`] the consistent-hash tables of external traffic, [`show`] the maps as
//! `cilium bpf lb list` prints its own, [`netfilter`] the fixed table that masquerades and rejects
//! what the interface programs mark.

pub mod maglev;
pub mod maps;
pub mod netfilter;
pub mod plan;
pub mod show;

pub use maps::{BackendId, FrontendId, Layout, MapLimits, MapOp, Maps, Master, Refusal, SlotKey, SlotValue};
pub use plan::{BackendAddress, CATCH_ALL_PROTOCOLS, EbpfPlan, Empty, Frontend, FrontendKey, Scope, Selection};
