use clap::Parser as _;

fn main() -> std::process::ExitCode {
    let cli = sidecar_injector::cli::Cli::parse();
    // One process-wide crypto provider; an Err only means one is already installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match cli.run() {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
