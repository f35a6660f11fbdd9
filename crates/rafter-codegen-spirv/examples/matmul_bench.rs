//! Throughput of the generated f32 matmul on the Vulkan device, for the products of the
//! benchmarked models and square sizes. Each size: one command buffer of `REPS` dispatches
//! separated by barriers, submitted `ROUNDS` times; the median round, divided by `REPS`.
//!
//! `cargo run --release -p rafter-codegen-spirv --example matmul_bench`
//! (prints `matmul MxNxK batch B: T us, G GFLOP/s`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rafter_codegen_spirv::{matmul_tiled, to_bytes, MatmulKernel, MatmulTile};
use rafter_hal::{Buffer, Device, ExecutablePayload, ExecutableSpec, MemoryKind, FORMAT_SPIRV};
use rafter_hal_vulkan::{VulkanDevice, VulkanDeviceOptions};
use rafter_ir::text::parse_graph;

const REPS: usize = 20;
const ROUNDS: usize = 7;

fn main() {
    let device = match VulkanDevice::new(VulkanDeviceOptions::default()) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("no Vulkan device: {e}");
            std::process::exit(2);
        }
    };
    println!("device: {}", device.info().name);
    let body = parse_graph(
        "graph @mm(%a: f32[b, m, k], %b: f32[k, n]) -> (%c) {\n  %c: f32[b, m, n] = matmul(%a, %b)\n}",
    )
    .expect("body");
    let kernels: Vec<(MatmulKernel, _)> = [
        MatmulTile::Large,
        MatmulTile::Small,
        MatmulTile::Sliced,
        MatmulTile::Tiny,
    ]
    .into_iter()
    .map(|tile| {
        let kernel = matmul_tiled(&body, tile).expect("matmul");
        let exe = device
            .load_executable(&ExecutableSpec {
                name: "matmul".into(),
                format: FORMAT_SPIRV.into(),
                payload: ExecutablePayload::Bytes(Arc::from(to_bytes(&kernel.spirv))),
            })
            .expect("load");
        (kernel, exe)
    })
    .collect();
    let sizes: &[(usize, usize, usize)] = &[
        (128, 768, 768),  // BERT-base attention projections, seq 128
        (128, 3072, 768), // BERT-base FFN up
        (128, 768, 3072), // BERT-base FFN down
        (1024, 1024, 1024),
        (4096, 4096, 4096),
    ];
    let queue = device.queue(0).expect("queue");
    for ((kernel, exe), &(m, n, k)) in kernels
        .iter()
        .flat_map(|ke| sizes.iter().map(move |s| (ke, s)))
    {
        let alloc = |len: usize| {
            device
                .allocate(len as u64 * 4, MemoryKind::DeviceLocal)
                .or_else(|_| device.allocate(len as u64 * 4, MemoryKind::HostVisibleShared))
                .expect("allocate")
        };
        let (a, b, c) = (alloc(m * k), alloc(k * n), alloc(m * n));
        let max = device.info().limits.max_workgroup_count;
        let (params, grid) = kernel
            .launch()
            .and_then(|l| l.matmul_dispatch(&[1, m, k], &[k, n], max))
            .expect("launch")
            .expect("a non-empty product");
        let bindings: Vec<_> = [&a, &b, &c].into_iter().map(Buffer::whole).collect();
        let mut builder = device.create_command_buffer().expect("builder");
        for _ in 0..REPS {
            builder
                .dispatch(exe, 0, &bindings, &params, grid)
                .expect("dispatch");
            builder.barrier();
        }
        let cb = builder.finish();
        let sem = device.create_semaphore(0).expect("semaphore");
        let mut times = Vec::new();
        for round in 0..=ROUNDS {
            let t = Instant::now();
            queue
                .submit(&cb, &[], &[(sem.clone(), round as u64 + 1)])
                .expect("submit");
            sem.wait(round as u64 + 1, Duration::from_secs(600))
                .expect("wait");
            if round > 0 {
                times.push(t.elapsed().as_secs_f64() / REPS as f64);
            }
        }
        times.sort_by(f64::total_cmp);
        let t = times[times.len() / 2];
        let gflops = 2.0 * (m * n * k) as f64 / t / 1e9;
        println!(
            "matmul {m}x{n}x{k} tile {}: {:.1} us, {gflops:.0} GFLOP/s",
            kernel.tile.size(),
            t * 1e6
        );
    }
}
