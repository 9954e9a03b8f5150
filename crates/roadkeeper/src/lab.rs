//! `roadkeeper lab ...`: the command line of the lab (crates/lab) wired to its commands.

use std::time::SystemTime;

use anyhow::{Context, bail};
use roadkeeper_lab::commands::{self, Up};
use roadkeeper_lab::selector::Selector;
use roadkeeper_lab::state::LabDir;
use roadkeeper_lab::table::{Options, Resource};

use crate::cli::{LabArgs, LabCommand};

/// Runs a `lab` subcommand.
pub fn run(args: LabArgs) -> anyhow::Result<()> {
    let lab = LabDir::resolve(args.lab_dir.as_deref());
    match args.command {
        LabCommand::Up { dir, nodes, proxy_mode } => commands::up(&lab, &Up { manifests: dir, nodes, proxy_mode })?,
        LabCommand::Down => {
            let removed = commands::down(&lab)?;
            println!(
                "Removed {} process(es), {} network namespace(s){}",
                removed.processes,
                removed.namespaces,
                if removed.directory { format!(" and {}", lab.path().display()) } else { String::new() }
            );
        }
        LabCommand::Status => print!("{}", commands::status(&lab)?),
        LabCommand::Get { resource, output, selector, namespace, all_namespaces, show_labels } => {
            let kind = Resource::parse(&resource).with_context(|| {
                format!("the lab lists pods, services, endpointslices, ingress or nodes, not {resource:?}")
            })?;
            let wide = match output.as_deref() {
                None => false,
                Some("wide") => true,
                Some(other) => bail!("-o {other}: the lab prints tables (-o wide)"),
            };
            let selector = Selector::parse(selector.as_deref().unwrap_or_default())?;
            let namespace = (!all_namespaces).then_some(namespace);
            let options = Options { namespace, wide, selector, show_labels, now: SystemTime::now() };
            match commands::get(&lab, kind, &options)? {
                Ok(table) => print!("{table}"),
                Err(nothing) => eprintln!("{nothing}"),
            }
        }
        LabCommand::Scale { target, replicas, namespace } => {
            println!("{}", commands::scale(&lab, &target, &namespace, replicas)?)
        }
        LabCommand::Label { resource, name, labels, overwrite, namespace } => {
            if !["pod", "pods", "po"].contains(&resource.as_str()) {
                bail!("the lab labels pods, not {resource:?}");
            }
            println!("{}", commands::label(&lab, &namespace, &name, &labels, overwrite)?)
        }
        LabCommand::Exec { name, namespace, container, command } => {
            match commands::exec(&lab, &name, namespace.as_deref(), container.as_deref(), &command)? {}
        }
        LabCommand::Controller => roadkeeper_lab::controller::run(lab)?,
        LabCommand::Container { spec } => match roadkeeper_lab::container::run(&spec)? {},
        LabCommand::Serve { name, root, tcp, udp } => roadkeeper_lab::container::serve(&name, root, &tcp, &udp)?,
    }
    Ok(())
}
