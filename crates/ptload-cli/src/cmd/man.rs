//! `ptload man`: manual pages (roff).

use std::io::Write;

use clap::CommandFactory;

use crate::args::CliResult;

/// The overview page, or `command`'s own.
pub(crate) fn run(command: Option<&str>, out: &mut impl Write) -> CliResult<u8> {
    let cli = crate::Cli::command();
    let page = match command {
        None => cli,
        Some(name) => {
            let names: Vec<String> = cli
                .get_subcommands()
                .map(|c| c.get_name().to_owned())
                .collect();
            let sub = cli
                .find_subcommand(name)
                .cloned()
                .ok_or_else(|| format!("no command {name:?}: one of {}", names.join(", ")))?;
            let title = format!("ptload-{name}");
            sub.name(title.clone())
                .bin_name(format!("ptload {name}"))
                .display_name(title)
                .version(env!("CARGO_PKG_VERSION"))
        }
    };
    clap_mangen::Man::new(page).render(out)?;
    Ok(0)
}
