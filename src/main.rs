//! The `hanzod` binary: everything is in `hanzod-cli`.

fn main() -> std::process::ExitCode {
    hanzod_cli::main()
}
