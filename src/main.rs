use clap::Parser as _;

fn main() -> std::process::ExitCode {
    let cli = sidecar_injector::cli::Cli::parse();
    match cli.run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
