//! Prints a GGUF file's header, metadata and tensors, and how long opening it took.
//!
//! `cargo run --release -p rafter-gguf --example gguf_dump -- model.gguf [--all]`
//! (`--all` prints every array element instead of the first few).

use std::io::Write;
use std::time::Instant;

use rafter_gguf::{GgufFile, Value};

fn show(value: &Value, all: bool) -> String {
    const SHOWN: usize = 6;
    match value {
        Value::Array(a) => {
            let n = if all { a.len() } else { a.len().min(SHOWN) };
            let items: Vec<String> = if let Some(s) = a.as_strings() {
                s.iter().take(n).map(|x| format!("{x:?}")).collect()
            } else if let Some(nested) = a.as_arrays() {
                nested
                    .iter()
                    .take(n)
                    .map(|x| show(&Value::Array(x.clone()), all))
                    .collect()
            } else {
                vec![format!("{} bytes", a.scalar_bytes().map_or(0, |b| b.len()))]
            };
            let more = if a.len() > n {
                format!(", ... {} more", a.len() - n)
            } else {
                String::new()
            };
            format!(
                "[{} x {}: {}{more}]",
                a.len(),
                a.elem_type(),
                items.join(", ")
            )
        }
        Value::String(s) if !all && s.len() > 80 => {
            let head: String = s.chars().take(80).collect();
            format!("{head:?}... ({} bytes)", s.len())
        }
        other => format!("{other:?}"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.iter().find(|a| !a.starts_with("--")) else {
        eprintln!("usage: gguf_dump FILE [--all]");
        std::process::exit(2);
    };
    let all = args.iter().any(|a| a == "--all");
    let start = Instant::now();
    let file = match GgufFile::open(path) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let opened = start.elapsed();
    // Write through a locked handle and stop quietly when the reader goes away (`| head`).
    let mut out = std::io::stdout().lock();
    let _ = print_all(&mut out, &file, opened, all);
}

fn print_all(
    out: &mut impl Write,
    file: &GgufFile,
    opened: std::time::Duration,
    all: bool,
) -> std::io::Result<()> {
    writeln!(
        out,
        "{}: GGUF v{}, {} bytes, {} keys, {} tensors, alignment {}, data at {} (opened and validated in {:.2} ms)",
        file.name(),
        file.version(),
        file.bytes().len(),
        file.metadata().len(),
        file.tensors().len(),
        file.alignment(),
        file.data_offset(),
        opened.as_secs_f64() * 1e3
    )?;
    for e in file.metadata() {
        writeln!(
            out,
            "  {:>10}  {} = {}",
            e.offset(),
            e.key(),
            show(e.value(), all)
        )?;
    }
    for t in file.tensors() {
        writeln!(
            out,
            "  {:>10}  {} {} {:?} ({} bytes)",
            t.data_start(),
            t.name(),
            t.ggml_type(),
            t.shape(),
            t.n_bytes()
        )?;
    }
    Ok(())
}
