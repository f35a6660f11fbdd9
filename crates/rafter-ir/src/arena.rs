//! Arena placement, shared by the compiler's static memory planner (`rafter-opt`'s
//! `memplan`) and the runtime's per-call placement of buffers the compiler could not size:
//! buffer liveness over a program's steps, offsets for blocks with live step ranges, the
//! lower bound no placement can beat, and a checker.
//!
//! Placement is "greedy by size" (the offset planner of TFLite): blocks are taken largest
//! first, and each goes into the smallest gap, among the blocks already placed whose live
//! ranges overlap its own, that holds it (best fit), or above all of them when none does.
//! Large blocks placed first fix the arena's shape; smaller ones fill the holes they leave.
//! Every offset is a multiple of [`ARENA_ALIGN`].

use crate::program::Program;

/// Alignment of every arena offset, in bytes (a cache line; the CPU device's allocation
/// alignment).
pub const ARENA_ALIGN: u64 = 64;

/// The first and last step (inclusive) that touch a buffer.
pub type Live = (usize, usize);

/// `x` rounded up to a multiple of [`ARENA_ALIGN`]; `None` on overflow.
pub fn align_up(x: u64) -> Option<u64> {
    x.checked_add(ARENA_ALIGN - 1)
        .map(|v| v & !(ARENA_ALIGN - 1))
}

/// Whether two live ranges share a step.
pub fn overlaps(a: Live, b: Live) -> bool {
    a.0 <= b.1 && b.0 <= a.1
}

/// Per buffer, the first and last step that reads or writes it; `None` when no step does.
/// A buffer written and never read lives at its producing step only. Indices out of range
/// (a program that fails [`Program::verify`]) are ignored.
pub fn liveness(program: &Program) -> Vec<Option<Live>> {
    let mut live: Vec<Option<Live>> = vec![None; program.buffers.len()];
    for (si, step) in program.steps.iter().enumerate() {
        for b in step.reads().into_iter().chain(step.writes()) {
            if let Some(slot) = live.get_mut(b) {
                *slot = Some(slot.map_or((si, si), |(first, _)| (first, si)));
            }
        }
    }
    live
}

/// One thing to place: `size` bytes needed during steps `live`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    pub size: u64,
    pub live: Live,
}

/// Places `blocks` at or above `base` (a multiple of [`ARENA_ALIGN`]) so that no two whose
/// live ranges overlap share a byte. Returns each block's offset and the end of the highest
/// block (`base` when there is none); `None` when an offset overflows `u64`.
pub fn place(blocks: &[Block], base: u64) -> Option<(Vec<u64>, u64)> {
    let mut order: Vec<usize> = (0..blocks.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(blocks[i].size), blocks[i].live.0, i));
    let mut offsets = vec![base; blocks.len()];
    let mut end = base;
    // Indices of the non-empty blocks placed so far, by offset.
    let mut placed: Vec<usize> = Vec::new();
    for i in order {
        let block = blocks[i];
        if block.size == 0 {
            continue;
        }
        let offset = best_fit(blocks, &offsets, &placed, block, base)?;
        offsets[i] = offset;
        end = end.max(offset.checked_add(block.size)?);
        let at = placed.partition_point(|&j| offsets[j] <= offset);
        placed.insert(at, i);
    }
    Some((offsets, end))
}

/// The offset for `block`: the start of the smallest gap between placed blocks live at the
/// same time that holds it, else the first aligned byte above all of them.
fn best_fit(
    blocks: &[Block],
    offsets: &[u64],
    placed: &[usize],
    block: Block,
    base: u64,
) -> Option<u64> {
    let mut best: Option<(u64, u64)> = None; // (gap, offset)
    let mut free_from = base;
    for &j in placed {
        if !overlaps(blocks[j].live, block.live) {
            continue;
        }
        let start = offsets[j];
        if start >= free_from {
            let gap = start - free_from;
            if gap >= block.size && best.is_none_or(|(g, _)| gap < g) {
                best = Some((gap, free_from));
            }
        }
        free_from = free_from.max(align_up(start.checked_add(blocks[j].size)?)?);
    }
    Some(best.map_or(free_from, |(_, offset)| offset))
}

/// The largest total size of blocks live at one step: no placement of them needs fewer
/// bytes. Saturates at `u64::MAX`.
pub fn peak(blocks: &[Block]) -> u64 {
    // (step, starts?, size): at equal steps, ends (of the previous step) come first.
    let mut events: Vec<(usize, bool, u64)> = Vec::with_capacity(2 * blocks.len());
    for b in blocks {
        events.push((b.live.0, true, b.size));
        events.push((b.live.1.saturating_add(1), false, b.size));
    }
    events.sort_unstable();
    let (mut now, mut most) = (0u64, 0u64);
    for (_, start, size) in events {
        if start {
            now = now.saturating_add(size);
            most = most.max(now);
        } else {
            now = now.saturating_sub(size);
        }
    }
    most
}

/// The first pair `(i, j)`, `i < j`, of non-empty blocks whose live ranges overlap and
/// whose bytes `offsets[i]..offsets[i] + size` overlap too; `None` for a valid placement.
pub fn find_collision(blocks: &[Block], offsets: &[u64]) -> Option<(usize, usize)> {
    let bytes = |i: usize| {
        let start = offsets[i] as u128;
        (start, start + blocks[i].size as u128)
    };
    for i in 0..blocks.len() {
        for j in i + 1..blocks.len() {
            if blocks[i].size == 0 || blocks[j].size == 0 {
                continue;
            }
            let ((s1, e1), (s2, e2)) = (bytes(i), bytes(j));
            if overlaps(blocks[i].live, blocks[j].live) && s1 < e2 && s2 < e1 {
                return Some((i, j));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(size: u64, live: Live) -> Block {
        Block { size, live }
    }

    #[test]
    fn disjoint_lifetimes_share_bytes() {
        // a: steps 0-1, b: steps 1-2, c: steps 2-3 (a and c never live together).
        let blocks = [block(100, (0, 1)), block(100, (1, 2)), block(100, (2, 3))];
        let (offsets, end) = place(&blocks, 0).unwrap();
        assert_eq!(offsets, vec![0, 128, 0]);
        assert_eq!(end, 228);
        assert_eq!(peak(&blocks), 200);
        assert_eq!(find_collision(&blocks, &offsets), None);
    }

    #[test]
    fn best_fit_takes_the_smallest_gap() {
        // Largest first: 1000 at 0 (steps 0-1); 600 (2-3) reuses its bytes; 300 (0-3) goes
        // above both, at 1024; 200 (2-3) takes the gap 640..1024 above the 600; 100 (3) has
        // the gaps 896..1024 (128 bytes) and none above, so it goes at 896.
        let blocks = [
            block(1000, (0, 1)),
            block(300, (0, 3)),
            block(200, (2, 3)),
            block(600, (2, 3)),
            block(100, (3, 3)),
        ];
        let (offsets, end) = place(&blocks, 0).unwrap();
        assert_eq!(offsets, vec![0, 1024, 640, 0, 896]);
        assert_eq!(end, 1324);
        assert_eq!(find_collision(&blocks, &offsets), None);
        assert_eq!(peak(&blocks), 1300);
    }

    #[test]
    fn base_and_empty_blocks() {
        let blocks = [block(0, (0, 0)), block(10, (0, 0))];
        let (offsets, end) = place(&blocks, 128).unwrap();
        assert_eq!(offsets, vec![128, 128]);
        assert_eq!(end, 138);
        assert_eq!(place(&[], 64), Some((vec![], 64)));
        assert_eq!(place(&[block(u64::MAX, (0, 0))], 64), None);
    }

    #[test]
    fn the_checker_finds_collisions() {
        let blocks = [block(64, (0, 1)), block(64, (1, 2)), block(64, (2, 3))];
        assert_eq!(find_collision(&blocks, &[0, 0, 64]), Some((0, 1)));
        assert_eq!(find_collision(&blocks, &[0, 64, 32]), Some((1, 2)));
        assert_eq!(find_collision(&blocks, &[0, 64, 0]), None);
    }
}
