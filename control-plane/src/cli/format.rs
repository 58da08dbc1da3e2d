//! How the CLI prints: for a person, or one JSON object a line. Its own file
//! so the client (which picks it) and the printers read it without reading
//! each other.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OutputFormat {
    #[default]
    Human,
    Json,
}
