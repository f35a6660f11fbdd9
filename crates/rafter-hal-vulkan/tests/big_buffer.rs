//! One buffer larger than 4 GiB, written end to end by a generated kernel (issue 4).
//!
//! Opt-in: runs only with `RAFTER_BIG_BUFFER_TEST=1` (it needs about 9 GiB of device memory;
//! lavapipe, CI's driver, has one 2 GiB heap). On the H100 see benchmarks/RESULTS.md.
//!
//! The kernel is rafter-codegen-spirv's fused elementwise `y = x + s` (`s` a broadcast
//! scalar), reading a 4.5 GiB input `x` and writing a 4.5 GiB device-local output `y`, both
//! through 64-bit device addresses: the elements past byte 2^32 of each are reached only by
//! pointer arithmetic that does not wrap at 32 bits. `y` is first filled with a NaN sentinel,
//! so an element the kernel never wrote (or wrote at an address wrapped below 4 GiB) shows;
//! `x[i]` depends on `i` with a period that does not divide 2^30 elements, so a write that
//! landed 4 GiB too low would put the wrong value there. Windows at the start, around the
//! 4 GiB offset, at the end and every 256 MiB are then copied into host memory and checked.

mod common;

use std::time::{Duration, Instant};

use rafter_codegen_spirv::{elementwise, to_bytes, ElementwiseKernel, Operand};
use rafter_hal::{
    Buffer, Device, ExecutablePayload, ExecutableSpec, FillPattern, MemoryKind, FORMAT_SPIRV,
};
use rafter_hal_vulkan::VulkanBuffer;
use rafter_ir::text::parse_graph;

const ENABLE_ENV: &str = "RAFTER_BIG_BUFFER_TEST";
const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
/// 4.5 GiB: more than 2^32 bytes, fewer than 2^31 f32 elements.
const BYTES: u64 = 4 * GIB + GIB / 2;
/// The input's period in elements: a prime, so it does not divide 2^30 (a 4 GiB shift).
const PERIOD: u64 = 999_983;
const SCALAR: f32 = 0.5;
/// `y`'s fill before the kernel: a quiet NaN no kernel output equals.
const SENTINEL: u32 = 0x7FC0_DEAD;

fn x_of(i: u64) -> f32 {
    (i % PERIOD) as f32
}

fn want_of(i: u64) -> f32 {
    x_of(i) + SCALAR
}

fn gib(bytes: u64) -> String {
    format!("{:.3} GiB", bytes as f64 / GIB as f64)
}

/// `[offset, offset + len)` of `y` to check, with a name.
struct Window {
    name: String,
    offset: u64,
    len: u64,
}

fn windows() -> Vec<Window> {
    let mut windows = vec![
        Window {
            name: "start".into(),
            offset: 0,
            len: MIB,
        },
        Window {
            name: "around 4 GiB".into(),
            offset: 4 * GIB - MIB,
            len: 2 * MIB,
        },
        Window {
            name: "end".into(),
            offset: BYTES - MIB,
            len: MIB,
        },
    ];
    // 64 KiB every 256 MiB, at an offset that moves, between the named windows.
    let mut offset = 256 * MIB + 4 * 1234;
    while offset + 64 * 1024 <= BYTES - MIB {
        windows.push(Window {
            name: format!("sample at {}", gib(offset)),
            offset,
            len: 64 * 1024,
        });
        offset += 256 * MIB + 4 * 4321;
    }
    windows
}

#[test]
fn one_buffer_larger_than_4_gib_is_written_and_read_end_to_end() {
    if std::env::var(ENABLE_ENV).as_deref() != Ok("1") {
        eprintln!(
            "skipping one_buffer_larger_than_4_gib: set {ENABLE_ENV}=1 to run it (it allocates \
             two {} buffers; CI's lavapipe has a 2 GiB heap)",
            gib(BYTES)
        );
        return;
    }
    let Some(device) = common::device_or_skip("one_buffer_larger_than_4_gib") else {
        return;
    };
    let caps = device.capabilities();
    let limits = &caps.limits;
    let (ma, mi, pa) = caps.api_version;
    eprintln!(
        "device: {} (driver {} {}, Vulkan {ma}.{mi}.{pa})",
        caps.device_name, caps.driver_name, caps.driver_info
    );
    eprintln!(
        "limits: maxStorageBufferRange {} bytes, maxMemoryAllocationSize {} bytes, \
         maxBufferSize {} bytes; heaps {:?}",
        limits.max_storage_buffer_range,
        limits.max_memory_allocation_size,
        limits.max_buffer_size,
        caps.memory_heaps.iter().map(|h| h.size).collect::<Vec<_>>()
    );
    let count = BYTES / 4;
    eprintln!(
        "buffers: {BYTES} bytes ({}, {count} f32 elements) each",
        gib(BYTES)
    );

    let allocate = |what: &str, kind: MemoryKind| -> Buffer {
        device.allocate(BYTES, kind).unwrap_or_else(|e| {
            panic!(
                "{ENABLE_ENV}=1 but device '{}' cannot allocate {what} of {BYTES} bytes ({}) as \
                 {kind:?}: {e}",
                caps.device_name,
                gib(BYTES)
            )
        })
    };
    let y = allocate("the output y", MemoryKind::DeviceLocal);
    let x = allocate("the input x", MemoryKind::HostVisibleShared);
    let s = device.allocate(4, MemoryKind::HostVisibleShared).unwrap();
    s.write_bytes(0, &SCALAR.to_le_bytes()).unwrap();
    let address = |b: &Buffer| b.downcast_ref::<VulkanBuffer>().unwrap().device_address();
    let memory = |b: &Buffer| b.downcast_ref::<VulkanBuffer>().unwrap().memory_flags();
    for (name, buffer) in [("y", &y), ("x", &x)] {
        eprintln!(
            "{name}: device addresses {:#x}..{:#x} ({:?})",
            address(buffer),
            address(buffer) + BYTES,
            memory(buffer)
        );
    }

    // x[i] = i mod PERIOD, written through the host mapping by a few threads.
    let started = Instant::now();
    x.map_write(0, BYTES, |bytes| {
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get().min(16));
        let per = (bytes.len() / 4).div_ceil(threads) * 4;
        std::thread::scope(|scope| {
            for (t, part) in bytes.chunks_mut(per).enumerate() {
                scope.spawn(move || {
                    let first = (t * per / 4) as u64;
                    for (j, chunk) in part.chunks_exact_mut(4).enumerate() {
                        chunk.copy_from_slice(&x_of(first + j as u64).to_le_bytes());
                    }
                });
            }
        });
    })
    .unwrap();
    eprintln!("x written by the host in {:.2?}", started.elapsed());

    let body = parse_graph(
        "graph @add_scalar(%x: f32[n], %s: f32[1]) -> (%y) {\n  %y: f32[n] = binary{op = add}(%x, %s)\n}",
    )
    .unwrap();
    let kernel = elementwise(&body).unwrap();
    assert_eq!(kernel.inputs, [Operand::Tensor, Operand::Scalar]);
    let executable = device
        .load_executable(&ExecutableSpec {
            name: "add_scalar".into(),
            format: FORMAT_SPIRV.into(),
            payload: ExecutablePayload::Bytes(to_bytes(&kernel.spirv).into()),
        })
        .unwrap();
    let max_x = device.info().limits.max_workgroup_count[0];
    let grid = ElementwiseKernel::workgroups(count, max_x);
    eprintln!(
        "kernel: y = x + s over {count} elements, grid {grid:?} x {} invocations",
        rafter_codegen_spirv::WORKGROUP_SIZE
    );

    let windows = windows();
    let readback_len: u64 = windows.iter().map(|w| w.len).sum();
    let readback = device.allocate(readback_len, MemoryKind::Host).unwrap();
    let mut builder = device.create_command_buffer().unwrap();
    builder
        .fill(y.whole(), FillPattern::U32(SENTINEL))
        .unwrap()
        .barrier()
        .dispatch(
            &executable,
            0,
            &[x.whole(), s.whole(), y.whole()],
            &ElementwiseKernel::params(count).unwrap(),
            grid,
        )
        .unwrap()
        .barrier();
    let mut at = 0;
    for w in &windows {
        builder
            .copy(
                y.range(w.offset, w.len).unwrap(),
                readback.range(at, w.len).unwrap(),
            )
            .unwrap();
        at += w.len;
    }
    let done = device.create_semaphore(0).unwrap();
    let started = Instant::now();
    device
        .queue(0)
        .unwrap()
        .submit(&builder.finish(), &[], &[(done.clone(), 1)])
        .unwrap();
    done.wait(1, Duration::from_secs(300)).unwrap();
    eprintln!(
        "fill + kernel + {} copies: {:.2?} (submit to signal)",
        windows.len(),
        started.elapsed()
    );

    let bytes = readback.read_bytes(0, readback_len).unwrap();
    let mut failures = Vec::new();
    let mut checked = 0u64;
    let mut at = 0usize;
    for w in &windows {
        let mut bad = 0u64;
        let mut first_bad = None;
        for (j, chunk) in bytes[at..at + w.len as usize].chunks_exact(4).enumerate() {
            let i = w.offset / 4 + j as u64;
            let got = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            if got.to_bits() != want_of(i).to_bits() {
                bad += 1;
                first_bad.get_or_insert(format!(
                    "element {i} (byte {}, address {:#x}): got {got} ({:#010x}), want {}",
                    i * 4,
                    address(&y) + i * 4,
                    got.to_bits(),
                    want_of(i)
                ));
            }
        }
        checked += w.len / 4;
        let beyond = w.offset + w.len > 1 << 32;
        eprintln!(
            "  {:<28} bytes {:>10}..{:<10} {}{}",
            w.name,
            w.offset,
            w.offset + w.len,
            if bad == 0 {
                "ok".to_string()
            } else {
                format!("{bad} wrong")
            },
            if beyond { " (past 2^32)" } else { "" }
        );
        if let Some(first) = first_bad {
            failures.push(format!("{}: {bad} wrong, first {first}", w.name));
        }
        at += w.len as usize;
    }
    eprintln!(
        "checked {checked} elements in {} windows; last element at byte {}, address {:#x}",
        windows.len(),
        BYTES - 4,
        address(&y) + BYTES - 4
    );
    assert!(failures.is_empty(), "mismatches:\n{}", failures.join("\n"));
    eprintln!("PASS: one {} buffer written end to end", gib(BYTES));
}
