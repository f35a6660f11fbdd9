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
    let per_call: Vec<usize> = (0..items.len())
        .filter(|&i| items[i].fixed.is_none())
        .collect();
    // Items no step touches get `base` and take no room.
    let blocks: Vec<Block> = per_call
        .iter()
        .map(|&i| Block {
            size: if items[i].live.is_some() {
                items[i].size
            } else {
                0
            },
            live: items[i].live.unwrap_or((0, 0)),
        })
        .collect();
    let (placed, end) = arena::place(&blocks, base)
        .ok_or_else(|| overflow(per_call.first().copied().unwrap_or(0)))?;
    for (&i, offset) in per_call.iter().zip(placed) {
        offsets[i] = offset;
    }
    Ok((offsets, end.max(base)))
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
        }
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
