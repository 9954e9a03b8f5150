//! The `roadkeeper` binary: parses the command line and wires sources to components.

mod bench;
mod bench_dns;
mod bench_ingress;
mod bench_nodeport;
mod bench_plot;
mod cli;
mod deploy_check;
mod dns_cmd;
mod gateway_cmd;
mod gateway_status;
mod healthcheck;
mod ingress_cmd;
mod ingress_status;
mod kube_proxy_flags;
mod lab;
mod proxy_cmd;
mod proxy_metrics;
mod serve;
mod status_writer;
mod trace_cmd;

/// mimalloc rather than glibc's malloc: after a full sync frees hundreds of MB of small objects,
/// glibc consolidates its free lists on the next larger allocation, which made planning one
/// Service take ~5 ms at 10,000 Services (measured); mimalloc keeps that at microseconds.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use tracing_subscriber::EnvFilter;

use cli::Command;

fn main() -> std::process::ExitCode {
    let cli = kube_proxy_flags::parse();
    let default_level = match cli.verbose {
        0 => "warn,roadkeeper=info",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level)))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let command = match cli.into_command() {
        Ok(command) => command,
        Err(err) => {
            eprintln!("roadkeeper: {err:#}");
            return std::process::ExitCode::from(2);
        }
    };
    let result = match command {
        Command::Proxy(args) => proxy_cmd::run(args),
        Command::Rules(args) => proxy_cmd::print_rules(args),
        Command::Cleanup(args) => proxy_cmd::cleanup(&args),
        Command::Bench(cli::Bench::Proxy(args)) => bench::run(args),
        Command::Bench(cli::Bench::Dns(args)) => bench_dns::run(args),
        Command::Bench(cli::Bench::Ingress(args)) => bench_ingress::run(args),
        Command::Bench(cli::Bench::Nodeport(args)) => bench_nodeport::run(args),
        Command::Lab(args) => lab::run(args),
        Command::Trace(args) => trace_cmd::run(args),
        Command::Dns(args) => dns_cmd::run(args),
        Command::Ingress(args) => ingress_cmd::run(args),
        Command::Gateway(args) => gateway_cmd::run(args),
        Command::Echo(args) => {
            let name = args.name.unwrap_or_else(roadkeeper_proxy::node::hostname);
            roadkeeper_netlab::echo::run_forever(&args.listen, &name)
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("roadkeeper: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
