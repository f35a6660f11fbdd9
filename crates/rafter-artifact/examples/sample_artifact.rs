//! Writes a small valid artifact (the tests' sample program): a seed for the fuzzer and a
//! file to look at. Usage: `sample_artifact OUT.rfa`.

#[path = "../tests/common/mod.rs"]
mod common;

fn main() {
    let out = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "sample.rfa".to_string());
    if let Some(dir) = std::path::Path::new(&out).parent() {
        std::fs::create_dir_all(dir).expect("create the output folder");
    }
    let program = common::sample_program();
    let len = common::writer(&program)
        .write(&out)
        .expect("write the sample artifact");
    println!("{out}: {len} bytes");
}
