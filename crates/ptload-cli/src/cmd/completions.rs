//! `ptload completions`: a shell completion script.

use std::io::Write;

use clap::CommandFactory;

use crate::args::CliResult;

/// The script for `shell`.
pub(crate) fn run(shell: clap_complete::Shell, out: &mut impl Write) -> CliResult<u8> {
    clap_complete::generate(shell, &mut crate::Cli::command(), "ptload", out);
    Ok(0)
}
