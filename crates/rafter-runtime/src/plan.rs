//! Per-call placement of arena buffers, and the access regions that order steps.
//!
//! A buffer in an arena either has a compile-time offset (`Storage::Arena { offset:
//! Some(_) }`, planned by the compiler against the declared symbol bounds, within the
//! arena's planned `size`) or is placed here, per call, once the call's sizes are known: by
//! the compiler's own placement ([`rafter_ir::arena::place`], greedy by size over the
//! program's liveness), above the planned `size`, so the two never collide. A fully planned
//! arena is therefore one allocation of its planned size (rounded up to the alignment).

use rafter_ir::arena::{self, Block};

/// One buffer to place in an arena.
#[derive(Clone, Debug)]
pub(crate) struct Item {
    /// Bytes this call.
    pub(crate) size: u64,
    /// First and last step that touch it (inclusive); `None` if no step does.
    pub(crate) live: Option<(usize, usize)>,
    /// The compile-time offset, if any.
    pub(crate) fixed: Option<u64>,
    /// The item whose bytes this one is, placed per call at the same offset (a reshape's
    /// result over its operand, [`views`]); `None` for an item of its own bytes, and for
    /// every item with a compile-time offset.
    pub(crate) view_of: Option<usize>,
}

/// Why an arena could not be placed: the item index and a message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct PlaceError {
    pub(crate) item: usize,
    pub(crate) msg: String,
}

/// Offsets for `items` and the arena's total size. `declared` is the arena's compile-time
/// size, which compile-time offsets must fit in; items placed per call go above it.
pub(crate) fn place(items: &[Item], declared: Option<u64>) -> Result<(Vec<u64>, u64), PlaceError> {
    let overflow = |item: usize| PlaceError {
        item,
        msg: "arena size overflows".into(),
    };
    let mut offsets = vec![0u64; items.len()];
    let mut base = declared.unwrap_or(0);
    for (i, item) in items.iter().enumerate() {
        let Some(offset) = item.fixed else { continue };
        let end = offset.checked_add(item.size).ok_or_else(|| overflow(i))?;
        if let Some(declared) = declared {
            if end > declared {
                return Err(PlaceError {
                    item: i,
                    msg: format!(
                        "needs bytes {offset}..{end} of its arena at its compile-time offset, \
                         but the arena was planned for {declared} bytes"
                    ),
                });
            }
        }
        offsets[i] = offset;
        base = base.max(end);
    }
    let base = arena::align_up(base).ok_or_else(|| overflow(0))?;
    // A view takes its root's offset; the root's block spans every view's lifetime and size.
    let root_of = |mut i: usize| {
        while let Some(s) = items[i].view_of.filter(|_| items[i].fixed.is_none()) {
            i = s;
        }
        i
    };
    let mut extent: Vec<(u64, Option<(usize, usize)>)> =
        items.iter().map(|it| (it.size, it.live)).collect();
    for (i, item) in items.iter().enumerate() {
        let r = root_of(i);
        if r != i {
            let (size, live) = (item.size, item.live);
            let e = &mut extent[r];
            e.0 = e.0.max(size);
            e.1 = match (e.1, live) {
                (Some((a, b)), Some((c, d))) => Some((a.min(c), b.max(d))),
                (x, y) => x.or(y),
            };
        }
    }
    let per_call: Vec<usize> = (0..items.len())
        .filter(|&i| items[i].fixed.is_none() && root_of(i) == i)
        .collect();
    // Items no step touches get `base` and take no room.
    let blocks: Vec<Block> = per_call
        .iter()
        .map(|&i| Block {
            size: if extent[i].1.is_some() {
                extent[i].0
            } else {
                0
            },
            live: extent[i].1.unwrap_or((0, 0)),
        })
        .collect();
    let (placed, end) = arena::place(&blocks, base)
        .ok_or_else(|| overflow(per_call.first().copied().unwrap_or(0)))?;
    for (&i, offset) in per_call.iter().zip(placed) {
        offsets[i] = offset;
    }
    for (i, item) in items.iter().enumerate() {
        if item.fixed.is_none() {
            offsets[i] = offsets[root_of(i)];
        }
    }
    Ok((offsets, end.max(base)))
}

/// The views among the arenas' buffers placed per call: `(result, operand)` of each step
/// that [`rafter_ir::program::Program::per_call_view`] names (operand and result in one
/// arena), of the same bytes this call (`size`), each operand taken by one view. The
/// compiler places such views over their operand when the buffers have sizes at compile
/// time (`rafter_opt::memplan`); buffers whose size a symbol decides (a sequence length)
/// are placed here, and without this every reshape of a dynamic-length transformer copied
/// its operand (BERT-base: 48 copies of 0.4 MB a call). The step is then not dispatched
/// (its bytes are already there).
pub(crate) fn views(
    p: &rafter_ir::program::Program,
    live: &[Option<(usize, usize)>],
    size: &dyn Fn(usize) -> u64,
) -> Vec<(usize, usize)> {
    let mut taken = std::collections::HashSet::new();
    let mut out = Vec::new();
    for si in 0..p.steps.len() {
        let Some((src, dst)) = p.per_call_view(si, live) else {
            continue;
        };
        if size(src) == size(dst) && taken.insert(src) {
            out.push((dst, src));
        }
    }
    out
}

/// Whether `step` is a view whose result already holds its operand's bytes this call:
/// a reshape-like kernel whose operand and result share their allocation and offset
/// (`alloc_of`), placed so at compile time or per call ([`views`]).
pub(crate) fn is_view_in_place(
    p: &rafter_ir::program::Program,
    step: &rafter_ir::program::Step,
    alloc_of: &[Option<(usize, u64)>],
) -> bool {
    let Some((src, dst)) = p.view_operands(step) else {
        return false;
    };
    let at = |b: usize| alloc_of.get(b).copied().flatten();
    at(src).is_some() && at(src) == at(dst)
}

/// The bytes a step touches: a range of one call-local allocation, or a host slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Region {
    /// Bytes `start..end` of allocation `alloc` (an index private to the call).
    Memory { alloc: usize, start: u64, end: u64 },
    /// The host slot of buffer `b`.
    Slot(usize),
}

/// One access of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Access {
    pub(crate) region: Region,
    pub(crate) write: bool,
}

impl Access {
    /// Whether the two must be ordered: they touch a common byte (or slot) and one writes.
    pub(crate) fn conflicts(&self, other: &Access) -> bool {
        if !(self.write || other.write) {
            return false;
        }
        match (self.region, other.region) {
            (Region::Slot(a), Region::Slot(b)) => a == b,
            (
                Region::Memory {
                    alloc: a,
                    start: s1,
                    end: e1,
                },
                Region::Memory {
                    alloc: b,
                    start: s2,
                    end: e2,
                },
            ) => a == b && s1 < e2 && s2 < e1,
            _ => false,
        }
    }
}

/// Whether any access of `a` conflicts with any of `b`.
pub(crate) fn any_conflict(a: &[Access], b: &[Access]) -> bool {
    a.iter().any(|x| b.iter().any(|y| x.conflicts(y)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rafter_ir::arena::{overlaps, ARENA_ALIGN};

    fn item(size: u64, live: (usize, usize)) -> Item {
        Item {
            size,
            live: Some(live),
            fixed: None,
            view_of: None,
        }
    }

    #[test]
    fn a_view_takes_its_operands_offset_and_keeps_it_alive() {
        // 0: steps 0-2, reshaped at step 2 into 1 (steps 2-5), itself reshaped at 5 into
        // 2 (5-6). 3 lives over steps 3-4: it must not take the views' bytes, though
        // their root's own life ended at step 2.
        let mut items = [
            item(100, (0, 2)),
            item(100, (2, 5)),
            item(100, (5, 6)),
            item(100, (3, 4)),
        ];
        items[1].view_of = Some(0);
        items[2].view_of = Some(1);
        let (offsets, total) = place(&items, None).unwrap();
        assert_eq!(offsets[1], offsets[0]);
        assert_eq!(offsets[2], offsets[0]);
        assert_ne!(offsets[3], offsets[0]);
        assert_eq!(total, 128 + 100);
        // Without the views, 3 reuses 0's bytes and the others get their own.
        for it in &mut items {
            it.view_of = None;
        }
        let (offsets, _) = place(&items, None).unwrap();
        assert_ne!(offsets[1], offsets[0]);
    }

    #[test]
    fn disjoint_lifetimes_share_bytes() {
        // a: steps 0-1, b: steps 1-2, c: steps 2-3 (a and c never live together).
        let items = [item(100, (0, 1)), item(100, (1, 2)), item(100, (2, 3))];
        let (offsets, total) = place(&items, None).unwrap();
        assert_eq!(offsets[0], offsets[2]);
        assert_ne!(offsets[0], offsets[1]);
        assert!(offsets.iter().all(|o| o % ARENA_ALIGN == 0));
        assert_eq!(total, 128 + 100);
    }

    #[test]
    fn first_fit_uses_gaps() {
        // A big buffer and two small ones live at once; then a small one fits in a gap.
        let items = [
            item(64, (0, 2)),
            item(1000, (0, 0)),
            item(64, (0, 2)),
            item(500, (1, 2)),
        ];
        let (offsets, total) = place(&items, None).unwrap();
        // Largest first: 1000 at 0; the 500 (live 1-2) may reuse it; the 64s follow.
        assert_eq!(offsets[1], 0);
        assert_eq!(offsets[3], 0);
        for (i, a) in items.iter().enumerate() {
            for (j, b) in items.iter().enumerate().skip(i + 1) {
                if overlaps(a.live.unwrap(), b.live.unwrap()) {
                    let (sa, sb) = (offsets[i], offsets[j]);
                    assert!(
                        sa + a.size <= sb || sb + b.size <= sa,
                        "{i} and {j} overlap"
                    );
                }
            }
        }
        assert!(total <= 1024 + 128);
    }

    #[test]
    fn fixed_offsets_are_kept_and_checked() {
        let items = [
            Item {
                size: 256,
                live: Some((0, 1)),
                fixed: Some(0),
                view_of: None,
            },
            item(10, (0, 1)),
        ];
        let (offsets, total) = place(&items, Some(256)).unwrap();
        assert_eq!(offsets, vec![0, 256]);
        assert_eq!(total, 266);
        let too_big = [Item {
            size: 300,
            live: Some((0, 1)),
            fixed: Some(0),
            view_of: None,
        }];
        let e = place(&too_big, Some(256)).unwrap_err();
        assert!(e.msg.contains("planned for 256 bytes"), "{}", e.msg);
    }

    #[test]
    fn conflicts_need_a_writer_and_an_overlap() {
        let m = |alloc, start, end, write| Access {
            region: Region::Memory { alloc, start, end },
            write,
        };
        assert!(m(0, 0, 10, true).conflicts(&m(0, 5, 15, false)));
        assert!(!m(0, 0, 10, false).conflicts(&m(0, 5, 15, false)));
        assert!(!m(0, 0, 10, true).conflicts(&m(0, 10, 15, true)));
        assert!(!m(0, 0, 10, true).conflicts(&m(1, 0, 10, true)));
        let s = |b, write| Access {
            region: Region::Slot(b),
            write,
        };
        assert!(s(3, true).conflicts(&s(3, false)));
        assert!(!s(3, true).conflicts(&s(4, true)));
        assert!(!s(3, true).conflicts(&m(3, 0, 10, true)));
    }
}
