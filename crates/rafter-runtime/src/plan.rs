//! Per-call placement of arena buffers, and the access regions that order steps.
//!
//! A buffer in an arena either has a compile-time offset (`Storage::Arena { offset:
//! Some(_) }`, planned by the compiler against the declared symbol bounds) or is placed here,
//! per call, once the call's sizes are known. The per-call planner is a first-fit over the
//! program's liveness: buffers are taken largest first, and each goes at the lowest
//! 64-byte-aligned offset where it overlaps no already placed buffer whose live step range
//! overlaps its own. Per-call buffers go above every compile-time one, so the two never
//! collide. (The real planner, shared with the compiler, replaces this.)

/// Alignment of every arena offset (the CPU device's allocation alignment).
pub(crate) const ARENA_ALIGN: u64 = 64;

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

fn align(x: u64) -> Option<u64> {
    x.checked_add(ARENA_ALIGN - 1)
        .map(|v| v & !(ARENA_ALIGN - 1))
}

fn overlaps(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 <= b.1 && b.0 <= a.1
}

/// Offsets for `items` and the arena's total size. `declared` is the arena's compile-time
/// size, which compile-time offsets must fit in.
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
    let base = align(base).ok_or_else(|| overflow(0))?;
    let mut total = base;
    let mut order: Vec<usize> = (0..items.len())
        .filter(|&i| items[i].fixed.is_none())
        .collect();
    order.sort_by(|&a, &b| items[b].size.cmp(&items[a].size).then(a.cmp(&b)));
    // (offset, end, live) of the per-call buffers placed so far.
    let mut placed: Vec<(u64, u64, (usize, usize))> = Vec::new();
    for i in order {
        let item = &items[i];
        let Some(live) = item.live else {
            offsets[i] = base;
            continue;
        };
        let mut conflicts: Vec<(u64, u64)> = placed
            .iter()
            .filter(|p| overlaps(p.2, live) && p.1 > p.0)
            .map(|p| (p.0, p.1))
            .collect();
        conflicts.sort_unstable();
        let mut offset = base;
        if item.size > 0 {
            for (start, end) in conflicts {
                let my_end = offset.checked_add(item.size).ok_or_else(|| overflow(i))?;
                if my_end <= start {
                    break;
                }
                if end > offset {
                    offset = align(end).ok_or_else(|| overflow(i))?;
                }
            }
        }
        let end = offset.checked_add(item.size).ok_or_else(|| overflow(i))?;
        offsets[i] = offset;
        total = total.max(end);
        placed.push((offset, end, live));
    }
    Ok((offsets, total))
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
