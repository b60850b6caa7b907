//! `delay-router`: the command line of [`delay_router::cli`].

// glibc's malloc and free cost far more per message than mimalloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    delay_router::cli::main()
}
