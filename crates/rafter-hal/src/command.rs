//! Command buffers: recorded work for a queue.

use std::any::Any;
use std::fmt;
use std::sync::{Arc, OnceLock};

use crate::device::{DeviceId, DeviceInfo, Limits};
use crate::error::{HalError, Result};
use crate::executable::Executable;
use crate::memory::BufferRange;

/// The value a fill writes, repeated over the destination range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FillPattern {
    /// One byte.
    U8(u8),
    /// Two bytes, little-endian.
    U16(u16),
    /// Four bytes, little-endian; what `vkCmdFillBuffer` writes.
    U32(u32),
}

impl FillPattern {
    /// The pattern's size in bytes.
    pub fn size(self) -> u64 {
        match self {
            FillPattern::U8(_) => 1,
            FillPattern::U16(_) => 2,
            FillPattern::U32(_) => 4,
        }
    }

    /// The pattern's bytes, little-endian.
    pub fn bytes(self) -> Vec<u8> {
        match self {
            FillPattern::U8(v) => vec![v],
            FillPattern::U16(v) => v.to_le_bytes().to_vec(),
            FillPattern::U32(v) => v.to_le_bytes().to_vec(),
        }
    }
}

/// One kernel launch.
#[derive(Debug, Clone)]
pub struct Dispatch {
    /// The executable holding the kernel.
    pub executable: Executable,
    /// Index into [`Executable::entry_points`].
    pub entry: usize,
    /// The buffer ranges the kernel reads and writes, by position (binding 0, 1, ...).
    pub bindings: Vec<BufferRange>,
    /// Push constants: small parameters such as the dynamic dims of this call, laid out as the
    /// kernel expects (the compiler decides the layout).
    pub params: Vec<u8>,
    /// The workgroup grid `[x, y, z]`; the kernel runs once per workgroup. A zero in any
    /// dimension makes the dispatch a no-op.
    pub workgroups: [u32; 3],
}

impl Dispatch {
    /// `x * y * z` (saturating; devices limit the grid so it cannot overflow).
    pub fn workgroup_total(&self) -> u64 {
        self.workgroups
            .iter()
            .fold(1u64, |total, &n| total.saturating_mul(n as u64))
    }
}

/// A recorded command.
#[derive(Debug, Clone)]
pub enum Command {
    /// A kernel launch.
    Dispatch(Dispatch),
    /// Copies `src` to `dst` (same length, no overlap).
    Copy {
        /// The bytes read.
        src: BufferRange,
        /// Where they go.
        dst: BufferRange,
    },
    /// Writes `pattern` repeatedly over `dst`.
    Fill {
        /// The bytes written.
        dst: BufferRange,
        /// The value repeated over them.
        pattern: FillPattern,
    },
    /// Every command before it completes, with its writes visible, before any command after
    /// it starts.
    Barrier,
}

/// Records commands for one device. Obtained from
/// [`Device::create_command_buffer`](crate::Device::create_command_buffer).
///
/// # Validation
/// Every recording call validates its arguments **now**, against the buffers' sizes, the
/// executable, and the device's [`Limits`], and returns an error naming the offending binding
/// or command; a command that was recorded is known to be in bounds. Nothing is executed
/// while recording.
///
/// # Execution model
/// Commands between two barriers have no ordering among themselves: a device may run them in
/// parallel, in any order. A [`barrier`](Self::barrier) orders everything before it (including
/// its memory writes) before everything after it. Within a dispatch, workgroups are unordered
/// and may run in parallel, so workgroups must write disjoint bytes.
///
/// # Aliasing
/// Commands that may run concurrently (same barrier segment, or different submissions with no
/// semaphore between them) must not write bytes that another of them reads or writes. The
/// runtime's scheduler guarantees this by construction; devices enforce what they can cheaply
/// (the CPU device fails a command whose access conflicts with one in flight rather than
/// racing).
pub struct CommandBufferBuilder {
    device: DeviceId,
    device_name: String,
    limits: Limits,
    commands: Vec<Command>,
}

impl CommandBufferBuilder {
    /// A builder for the device described by `info` (for device implementations).
    pub fn new(info: &DeviceInfo) -> CommandBufferBuilder {
        CommandBufferBuilder {
            device: info.id,
            device_name: info.name.clone(),
            limits: info.limits.clone(),
            commands: Vec::new(),
        }
    }

    /// Records a dispatch of `executable`'s entry point `entry` over the `workgroups` grid.
    ///
    /// Errors: the executable belongs to another device ([`HalError::WrongDevice`]), `entry`
    /// is out of range ([`HalError::UnknownEntryPoint`]), a binding does not fit its buffer
    /// ([`HalError::OutOfRange`], "binding 2: range 0..4096 exceeds buffer of 1024 bytes"),
    /// or a limit is exceeded ([`HalError::LimitExceeded`]).
    pub fn dispatch(
        &mut self,
        executable: &Executable,
        entry: usize,
        bindings: &[BufferRange],
        params: &[u8],
        workgroups: [u32; 3],
    ) -> Result<&mut Self> {
        if executable.device_id() != self.device {
            return Err(HalError::WrongDevice {
                what: format!("executable '{}'", executable.name()),
                owner: executable.device_id(),
                device: self.device,
            });
        }
        executable.entry_name(entry)?;
        check_limit(
            "bindings per dispatch",
            bindings.len() as u64,
            self.limits.max_bindings as u64,
        )?;
        check_limit(
            "push-constant bytes",
            params.len() as u64,
            self.limits.max_push_constant_size as u64,
        )?;
        for (axis, (&count, &max)) in ["x", "y", "z"]
            .iter()
            .zip(workgroups.iter().zip(&self.limits.max_workgroup_count))
        {
            check_limit(&format!("workgroup count {axis}"), count as u64, max as u64)?;
        }
        for (i, binding) in bindings.iter().enumerate() {
            binding.validate(&format!("binding {i}"))?;
        }
        self.commands.push(Command::Dispatch(Dispatch {
            executable: executable.clone(),
            entry,
            bindings: bindings.to_vec(),
            params: params.to_vec(),
            workgroups,
        }));
        Ok(self)
    }

    /// Records a copy of `src` into `dst`. They must have the same length and must not
    /// overlap ([`HalError::CopyOverlap`]); both must fit their buffers.
    pub fn copy(&mut self, src: BufferRange, dst: BufferRange) -> Result<&mut Self> {
        src.validate("copy source")?;
        dst.validate("copy destination")?;
        if src.len != dst.len {
            return Err(HalError::InvalidCommand(format!(
                "copy: source is {} bytes but destination is {} bytes",
                src.len, dst.len
            )));
        }
        if src.overlaps(&dst) {
            return Err(HalError::CopyOverlap {
                src_start: src.offset,
                src_end: src.end(),
                dst_start: dst.offset,
                dst_end: dst.end(),
            });
        }
        self.commands.push(Command::Copy { src, dst });
        Ok(self)
    }

    /// Records a fill of `dst` with `pattern`. The range's offset and length must be
    /// multiples of the pattern's size.
    pub fn fill(&mut self, dst: BufferRange, pattern: FillPattern) -> Result<&mut Self> {
        dst.validate("fill destination")?;
        let size = pattern.size();
        // Pattern sizes are powers of two.
        if (dst.offset | dst.len) & (size - 1) != 0 {
            return Err(HalError::InvalidCommand(format!(
                "fill: range {}..{} is not aligned to the {size}-byte pattern",
                dst.offset,
                dst.end()
            )));
        }
        self.commands.push(Command::Fill { dst, pattern });
        Ok(self)
    }

    /// Records a barrier: everything recorded before it completes before anything recorded
    /// after it starts. A barrier at the start or right after another barrier is dropped.
    pub fn barrier(&mut self) -> &mut Self {
        if !matches!(self.commands.last(), None | Some(Command::Barrier)) {
            self.commands.push(Command::Barrier);
        }
        self
    }

    /// Ends recording. The result is immutable and may be submitted any number of times, to
    /// any queue of the device, from any thread.
    pub fn finish(mut self) -> CommandBuffer {
        if matches!(self.commands.last(), Some(Command::Barrier)) {
            self.commands.pop();
        }
        CommandBuffer(Arc::new(CommandBufferInner {
            device: self.device,
            device_name: self.device_name,
            commands: self.commands,
            prepared: OnceLock::new(),
        }))
    }
}

impl fmt::Debug for CommandBufferBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CommandBufferBuilder")
            .field("device", &self.device_name)
            .field("commands", &self.commands)
            .finish()
    }
}

fn check_limit(what: &str, value: u64, max: u64) -> Result<()> {
    if value > max {
        return Err(HalError::LimitExceeded {
            what: what.to_string(),
            value,
            max,
        });
    }
    Ok(())
}

/// A finished, immutable list of commands for one device. Cheap to clone (shared).
///
/// It holds handles to every buffer and executable it uses, so they live as long as it does
/// (and a queue keeps the command buffer alive until its submission completes).
#[derive(Clone)]
pub struct CommandBuffer(Arc<CommandBufferInner>);

struct CommandBufferInner {
    device: DeviceId,
    device_name: String,
    commands: Vec<Command>,
    prepared: OnceLock<Arc<dyn Any + Send + Sync>>,
}

impl CommandBuffer {
    /// The device it was recorded for; only that device's queues accept it.
    pub fn device_id(&self) -> DeviceId {
        self.0.device
    }

    /// The recorded commands, in order.
    pub fn commands(&self) -> &[Command] {
        &self.0.commands
    }

    /// The commands split at barriers: each segment's commands may run concurrently, and
    /// each segment completes before the next starts.
    pub fn segments(&self) -> impl Iterator<Item = &[Command]> {
        self.0
            .commands
            .split(|c| matches!(c, Command::Barrier))
            .filter(|segment| !segment.is_empty())
    }

    /// A slot where the device caches its own translation of the commands on first submit
    /// (resolved buffer pointers, a recorded `VkCommandBuffer`), reused by later submits.
    pub fn prepared(&self) -> &OnceLock<Arc<dyn Any + Send + Sync>> {
        &self.0.prepared
    }
}

impl fmt::Debug for CommandBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CommandBuffer")
            .field("device", &self.0.device_name)
            .field("commands", &self.0.commands)
            .finish()
    }
}
