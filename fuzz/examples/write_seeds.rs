//! Writes the seed inputs to seeds/<target>/ (replacing what is there):
//!
//!     cargo run --manifest-path fuzz/Cargo.toml --example write_seeds
use std::path::Path;

fn main() -> std::io::Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
    for (target, seeds) in [
        ("headers", delay_router_fuzz::seeds::headers()),
        ("delay", delay_router_fuzz::seeds::delay()),
    ] {
        let dir = dir.join(target);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        for (name, bytes) in &seeds {
            std::fs::write(dir.join(name), bytes)?;
        }
        println!("{}: {} seeds", dir.display(), seeds.len());
    }
    Ok(())
}
