//! SPIR-V executables (one compute pipeline per entry point) and the pipeline cache.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use ash::vk;
use rafter_hal::{
    DeviceId, ExecutableImpl, ExecutablePayload, ExecutableSpec, HalError, FORMAT_SPIRV,
};

use crate::caps::VulkanCapabilities;
use crate::device::Shared;
use crate::error::call_error;
use crate::stall_probe::StallProbe;

const SPIRV_MAGIC: u32 = 0x0723_0203;
const OP_ENTRY_POINT: u32 = 15;
const OP_CAPABILITY: u32 = 17;
const EXECUTION_MODEL_GL_COMPUTE: u32 = 5;

/// A module's instructions after the header, each with the word it starts at. Checks the
/// module is whole words with the SPIR-V magic and that every instruction's word count
/// fits, so a bad payload is an error here rather than undefined behaviour in the driver.
fn instructions(words: &[u32]) -> Result<Vec<(usize, &[u32])>, String> {
    if words.len() < 5 {
        return Err(format!(
            "{} words is shorter than a SPIR-V header",
            words.len()
        ));
    }
    if words[0] != SPIRV_MAGIC {
        return Err(format!(
            "bad magic {:#010x} (SPIR-V is {SPIRV_MAGIC:#010x}, little-endian)",
            words[0]
        ));
    }
    let mut out = Vec::new();
    let mut at = 5;
    while at < words.len() {
        let count = (words[at] >> 16) as usize;
        if count == 0 || at + count > words.len() {
            return Err(format!(
                "instruction at word {at} has a bad word count {count}"
            ));
        }
        out.push((at, &words[at..at + count]));
        at += count;
    }
    Ok(out)
}

/// The names of a module's `GLCompute` entry points, in module order. Also checks the
/// module's framing ([`instructions`]).
pub fn spirv_entry_points(words: &[u32]) -> Result<Vec<String>, String> {
    let mut entries = Vec::new();
    for (at, op) in instructions(words)? {
        if op[0] & 0xffff == OP_ENTRY_POINT && op.len() >= 4 && op[1] == EXECUTION_MODEL_GL_COMPUTE
        {
            let bytes: Vec<u8> = op[3..].iter().flat_map(|w| w.to_le_bytes()).collect();
            let end = bytes
                .iter()
                .position(|&b| b == 0)
                .ok_or_else(|| format!("entry point name at word {at} is not terminated"))?;
            let name = std::str::from_utf8(&bytes[..end])
                .map_err(|_| format!("entry point name at word {at} is not UTF-8"))?;
            entries.push(name.to_string());
        }
    }
    Ok(entries)
}

/// The SPIR-V capabilities a module declares (`OpCapability` operands, in module order).
/// Also checks the module's framing ([`instructions`]).
pub fn spirv_capabilities(words: &[u32]) -> Result<Vec<u32>, String> {
    Ok(instructions(words)?
        .into_iter()
        .filter(|(_, op)| op[0] & 0xffff == OP_CAPABILITY && op.len() == 2)
        .map(|(_, op)| op[1])
        .collect())
}

/// Byte sizes of a module's types and its variables' storage classes and types, from one
/// walk over its instructions: what the workgroup-memory and push-constant queries read.
struct TypeLayout {
    size: HashMap<u32, u64>,
    /// `(storage class, pointee type)` of every `OpVariable`.
    variables: Vec<(u32, u32)>,
}

impl TypeLayout {
    /// Scalars, vectors and arrays of them at their natural size; a struct ends at its last
    /// member's end (at its `Offset` decoration where it has one, else right after the
    /// member before it); a physical-storage-buffer pointer is 8 bytes. Also checks the
    /// module's framing ([`instructions`]).
    fn of(words: &[u32]) -> Result<TypeLayout, String> {
        // Opcodes and operands, from the SPIR-V spec's tables.
        const OP_MEMBER_DECORATE: u32 = 72;
        const OP_TYPE_INT: u32 = 21;
        const OP_TYPE_FLOAT: u32 = 22;
        const OP_TYPE_VECTOR: u32 = 23;
        const OP_TYPE_ARRAY: u32 = 28;
        const OP_TYPE_STRUCT: u32 = 30;
        const OP_TYPE_POINTER: u32 = 32;
        const OP_CONSTANT: u32 = 43;
        const OP_VARIABLE: u32 = 59;
        const DECORATION_OFFSET: u32 = 35;
        const PHYSICAL_STORAGE_BUFFER: u32 = 5349;
        let mut size: HashMap<u32, u64> = HashMap::new();
        let mut constant: HashMap<u32, u64> = HashMap::new();
        let mut pointee: HashMap<u32, u32> = HashMap::new();
        let mut offsets: HashMap<(u32, u32), u64> = HashMap::new();
        let mut variables = Vec::new();
        for (_, op) in instructions(words)? {
            let operand = |i: usize| op.get(i).copied().unwrap_or(0);
            let size_of = |id: u32| size.get(&id).copied().unwrap_or(0);
            match op[0] & 0xffff {
                OP_MEMBER_DECORATE if operand(3) == DECORATION_OFFSET => {
                    offsets.insert((operand(1), operand(2)), u64::from(operand(4)));
                }
                OP_TYPE_INT | OP_TYPE_FLOAT => {
                    size.insert(operand(1), u64::from(operand(2)) / 8);
                }
                OP_TYPE_VECTOR => {
                    let bytes = size_of(operand(2)) * u64::from(operand(3));
                    size.insert(operand(1), bytes);
                }
                OP_TYPE_ARRAY => {
                    let length = constant.get(&operand(3)).copied().unwrap_or(0);
                    size.insert(operand(1), size_of(operand(2)).saturating_mul(length));
                }
                OP_TYPE_STRUCT => {
                    let id = operand(1);
                    let (mut next, mut end) = (0u64, 0u64);
                    for (i, &member) in op.iter().skip(2).enumerate() {
                        let at = offsets.get(&(id, i as u32)).copied().unwrap_or(next);
                        next = at.saturating_add(size_of(member));
                        end = end.max(next);
                    }
                    size.insert(id, end);
                }
                OP_TYPE_POINTER => {
                    pointee.insert(operand(1), operand(3));
                    if operand(2) == PHYSICAL_STORAGE_BUFFER {
                        size.insert(operand(1), 8);
                    }
                }
                OP_CONSTANT if op.len() == 4 => {
                    constant.insert(operand(2), u64::from(operand(3)));
                }
                OP_VARIABLE => {
                    if let Some(&ty) = pointee.get(&operand(1)) {
                        variables.push((operand(3), ty));
                    }
                }
                _ => {}
            }
        }
        Ok(TypeLayout { size, variables })
    }

    /// Sizes of the variables of one storage class.
    fn variable_sizes(&self, storage_class: u32) -> impl Iterator<Item = u64> + '_ {
        self.variables
            .iter()
            .filter(move |(class, _)| *class == storage_class)
            .map(|(_, ty)| self.size.get(ty).copied().unwrap_or(0))
    }
}

/// Bytes of workgroup (shared) memory a module declares: the sum of its `Workgroup`
/// variables' types, arrays and vectors of scalars taken at their natural size (how
/// drivers lay out workgroup memory without an explicit layout). Also checks the module's
/// framing ([`instructions`]).
pub fn spirv_workgroup_bytes(words: &[u32]) -> Result<u64, String> {
    const WORKGROUP: u32 = 4;
    Ok(TypeLayout::of(words)?
        .variable_sizes(WORKGROUP)
        .fold(0u64, u64::saturating_add))
}

/// The bytes of push constants a module declares: the end of the last member of its
/// `PushConstant` block (member offsets from `OpMemberDecorate ... Offset`). A dispatch must
/// push at least this many: with `maintenance4` (which rafter enables) bytes never pushed
/// are undefined, not an error the validation layer can see, so under validation the
/// recorder checks this itself. Also checks the module's framing ([`instructions`]).
pub fn spirv_push_constant_bytes(words: &[u32]) -> Result<u64, String> {
    const PUSH_CONSTANT: u32 = 9;
    Ok(TypeLayout::of(words)?
        .variable_sizes(PUSH_CONSTANT)
        .max()
        .unwrap_or(0))
}

/// A loaded SPIR-V module: one compute pipeline per `GLCompute` entry point, all with the
/// device's single pipeline layout (no descriptors, push constants only).
pub struct VulkanExecutable {
    shared: Arc<Shared>,
    name: String,
    entries: Vec<String>,
    pipelines: Vec<vk::Pipeline>,
    /// The push-constant bytes the module declares ([`spirv_push_constant_bytes`]).
    pub(crate) push_bytes: u64,
}

impl VulkanExecutable {
    pub(crate) fn load(
        shared: Arc<Shared>,
        spec: &ExecutableSpec,
    ) -> Result<VulkanExecutable, HalError> {
        if spec.format != FORMAT_SPIRV {
            return Err(HalError::UnsupportedExecutableFormat {
                device: shared.name.clone(),
                format: spec.format.clone(),
            });
        }
        let invalid = |reason: String| HalError::InvalidExecutable {
            name: spec.name.clone(),
            reason,
        };
        let ExecutablePayload::Bytes(bytes) = &spec.payload else {
            return Err(invalid(
                "a SPIR-V executable's payload must be bytes".into(),
            ));
        };
        if bytes.len() % 4 != 0 {
            return Err(invalid(format!(
                "{} bytes is not a whole number of words",
                bytes.len()
            )));
        }
        let words: Vec<u32> = bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let entries = spirv_entry_points(&words).map_err(invalid)?;
        if entries.is_empty() {
            return Err(invalid("the module has no GLCompute entry point".into()));
        }
        // A module using a feature the device lacks is refused here, by name, rather than
        // handed to the driver (which may crash on it): an f16 kernel on a device without
        // storageBuffer16BitAccess, say.
        let missing = shared.caps.missing_for_module(&words).map_err(invalid)?;
        if !missing.is_empty() {
            return Err(HalError::Unsupported(format!(
                "executable '{}' needs the device feature{} {}, which device '{}' ({}) lacks",
                spec.name,
                if missing.len() > 1 { "s" } else { "" },
                missing.join(", "),
                shared.name,
                shared.caps.device_name
            )));
        }
        if let Some((declared, limit)) = shared
            .caps
            .workgroup_memory_excess(&words)
            .map_err(invalid)?
        {
            return Err(HalError::Unsupported(format!(
                "executable '{}' declares {declared} bytes of workgroup memory; device '{}' \
                 ({}) offers {limit} (maxComputeSharedMemorySize)",
                spec.name, shared.name, shared.caps.device_name
            )));
        }
        let push_bytes = spirv_push_constant_bytes(&words).map_err(invalid)?;
        let device = &shared.device;
        let module_info = vk::ShaderModuleCreateInfo::default().code(&words);
        // Held until the pipelines exist in that diagnostic variant (issue 28's A/B).
        let exclusive = match shared.stall_probe {
            StallProbe::ExclusivePipelines => shared.signal_guard(),
            _ => None,
        };
        // SAFETY: `words` is a whole SPIR-V module (magic and instruction lengths checked)
        // living across the call. Its validity beyond that is the producer's contract: rafter's
        // code generator checks every module with spirv-val in its tests.
        let module = unsafe { device.create_shader_module(&module_info, None) }
            .map_err(|r| call_error("vkCreateShaderModule", r, 0))?;
        let names: Vec<std::ffi::CString> = entries
            .iter()
            .map(|n| std::ffi::CString::new(n.as_str()).expect("no NUL: cut at the first NUL"))
            .collect();
        let infos: Vec<vk::ComputePipelineCreateInfo> = names
            .iter()
            .map(|name| {
                vk::ComputePipelineCreateInfo::default()
                    .stage(
                        vk::PipelineShaderStageCreateInfo::default()
                            .stage(vk::ShaderStageFlags::COMPUTE)
                            .module(module)
                            .name(name),
                    )
                    .layout(shared.pipeline_layout)
            })
            .collect();
        // SAFETY: the infos, the module and the names live across the call; the layout and
        // cache belong to this device. The cache is internally synchronised
        // (no EXTERNALLY_SYNCHRONIZED flag).
        let created =
            unsafe { device.create_compute_pipelines(shared.pipeline_cache.raw, &infos, None) };
        // SAFETY: pipelines keep what they need; the module may go once they exist.
        unsafe { device.destroy_shader_module(module, None) };
        drop(exclusive);
        let pipelines = match created {
            Ok(pipelines) => pipelines,
            Err((partial, result)) => {
                for pipeline in partial {
                    // SAFETY: never used; null handles are ignored.
                    unsafe { device.destroy_pipeline(pipeline, None) };
                }
                return Err(call_error("vkCreateComputePipelines", result, 0));
            }
        };
        Ok(VulkanExecutable {
            shared,
            name: spec.name.clone(),
            entries,
            pipelines,
            push_bytes,
        })
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub(crate) fn pipeline(&self, entry: usize) -> Result<vk::Pipeline, HalError> {
        self.pipelines
            .get(entry)
            .copied()
            .ok_or_else(|| HalError::UnknownEntryPoint {
                executable: self.name.clone(),
                entry,
                count: self.pipelines.len(),
            })
    }
}

impl ExecutableImpl for VulkanExecutable {
    fn name(&self) -> &str {
        &self.name
    }

    fn entry_points(&self) -> &[String] {
        &self.entries
    }

    fn device_id(&self) -> DeviceId {
        self.shared.id
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for VulkanExecutable {
    fn drop(&mut self) {
        for &pipeline in &self.pipelines {
            // SAFETY: command buffers that dispatch this executable hold a handle to it, so
            // the last handle goes only after every such command buffer is gone.
            unsafe { self.shared.device.destroy_pipeline(pipeline, None) };
        }
    }
}

impl fmt::Debug for VulkanExecutable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VulkanExecutable")
            .field("name", &self.name)
            .field("entries", &self.entries)
            .finish()
    }
}

/// The `VkPipelineCache`, optionally backed by a file.
///
/// The file is read only when its header names this driver's vendor, device and
/// `pipelineCacheUUID` (a cache from another driver version is worthless and a corrupt one
/// must not reach the driver), and written atomically (a temporary file, then rename), so a
/// crash mid-write leaves the old cache.
pub(crate) struct PipelineCache {
    pub(crate) raw: vk::PipelineCache,
    path: Option<PathBuf>,
    status: String,
}

/// `VK_PIPELINE_CACHE_HEADER_VERSION_ONE`'s header: size, version, vendor, device, UUID.
const CACHE_HEADER_LEN: usize = 32;

fn cache_header_matches(data: &[u8], caps: &VulkanCapabilities) -> Result<(), String> {
    if data.len() < CACHE_HEADER_LEN {
        return Err(format!("{} bytes is shorter than the header", data.len()));
    }
    let word = |i: usize| u32::from_le_bytes([data[i], data[i + 1], data[i + 2], data[i + 3]]);
    if word(0) as usize != CACHE_HEADER_LEN || word(4) != 1 {
        return Err("not a version-one pipeline cache header".into());
    }
    if word(8) != caps.vendor_id
        || word(12) != caps.device_id
        || data[16..32] != caps.pipeline_cache_uuid
    {
        return Err("written by another device or driver version".into());
    }
    Ok(())
}

impl PipelineCache {
    pub(crate) fn open(
        device: &ash::Device,
        caps: &VulkanCapabilities,
        path: Option<PathBuf>,
    ) -> Result<PipelineCache, vk::Result> {
        let (initial, status) = match &path {
            None => (Vec::new(), "in memory only (no path)".to_string()),
            Some(path) => match std::fs::read(path) {
                Ok(data) => match cache_header_matches(&data, caps) {
                    Ok(()) => {
                        let status = format!("loaded {} bytes from {}", data.len(), path.display());
                        (data, status)
                    }
                    Err(why) => (
                        Vec::new(),
                        format!("empty: {} ignored: {why}", path.display()),
                    ),
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => (
                    Vec::new(),
                    format!("empty: {} does not exist yet", path.display()),
                ),
                Err(e) => (
                    Vec::new(),
                    format!("empty: reading {}: {e}", path.display()),
                ),
            },
        };
        let info = vk::PipelineCacheCreateInfo::default().initial_data(&initial);
        // SAFETY: `initial` is empty or carries a header for this exact device and driver;
        // it lives across the call.
        let raw = unsafe { device.create_pipeline_cache(&info, None) }?;
        Ok(PipelineCache { raw, path, status })
    }

    pub(crate) fn status(&self) -> &str {
        &self.status
    }

    /// Writes the cache to its path (if any), atomically.
    pub(crate) fn save(&self, device: &ash::Device) -> Result<(), HalError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        // SAFETY: the cache belongs to `device` and is internally synchronised.
        let data = unsafe { device.get_pipeline_cache_data(self.raw) }
            .map_err(|r| call_error("vkGetPipelineCacheData", r, 0))?;
        let io = |e: std::io::Error| {
            HalError::Unsupported(format!(
                "writing the pipeline cache {}: {e}",
                path.display()
            ))
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, &data).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// # Safety
    /// No pipeline creation may be running on the cache.
    pub(crate) unsafe fn destroy(&self, device: &ash::Device) {
        // SAFETY: per the contract; the cache belongs to `device`.
        unsafe { device.destroy_pipeline_cache(self.raw, None) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-assembled module: capability Shader, entry point `main`, a workgroup array
    /// of ten 4-f16 vectors (80 bytes) and a function-storage one (not counted).
    fn module() -> Vec<u32> {
        let op = |opcode: u32, operands: &[u32]| {
            let mut words = vec![((operands.len() as u32 + 1) << 16) | opcode];
            words.extend_from_slice(operands);
            words
        };
        let mut w = vec![SPIRV_MAGIC, 0x0001_0600, 0, 20, 0];
        w.extend(op(17, &[1]));
        w.extend(op(15, &[5, 1, u32::from_le_bytes(*b"main"), 0]));
        w.extend(op(21, &[2, 32, 0]));
        w.extend(op(22, &[3, 16]));
        w.extend(op(23, &[4, 3, 4]));
        w.extend(op(43, &[2, 5, 10]));
        w.extend(op(28, &[6, 4, 5]));
        w.extend(op(32, &[7, 4, 6]));
        w.extend(op(59, &[7, 8, 4]));
        w.extend(op(32, &[9, 7, 6]));
        w.extend(op(59, &[9, 10, 7]));
        w
    }

    #[test]
    fn a_module_is_read_for_entries_capabilities_and_workgroup_bytes() {
        let m = module();
        assert_eq!(spirv_entry_points(&m).unwrap(), ["main"]);
        assert_eq!(spirv_capabilities(&m).unwrap(), [1]);
        assert_eq!(spirv_workgroup_bytes(&m).unwrap(), 80);
    }

    /// A push block `{ ptr a @0; ptr b @8; u32 count @16; u32 dim @20 }` (pointers to
    /// PhysicalStorageBuffer) declares 24 bytes; the end of the last member counts, not the
    /// order the members are listed in.
    #[test]
    fn the_push_constant_block_size_is_read() {
        let op = |opcode: u32, operands: &[u32]| {
            let mut words = vec![((operands.len() as u32 + 1) << 16) | opcode];
            words.extend_from_slice(operands);
            words
        };
        let mut w = vec![SPIRV_MAGIC, 0x0001_0600, 0, 20, 0];
        w.extend(op(17, &[1]));
        w.extend(op(15, &[5, 1, u32::from_le_bytes(*b"main"), 0]));
        // Struct 6 members: ptr, u32, ptr, u32 at offsets 0, 16, 8, 20.
        for (member, offset) in [(0, 0), (1, 16), (2, 8), (3, 20)] {
            w.extend(op(72, &[6, member, 35, offset]));
        }
        w.extend(op(21, &[2, 32, 0]));
        w.extend(op(22, &[3, 32]));
        w.extend(op(32, &[4, 5349, 3]));
        w.extend(op(30, &[6, 4, 2, 4, 2]));
        w.extend(op(32, &[7, 9, 6]));
        w.extend(op(59, &[7, 8, 9]));
        assert_eq!(spirv_push_constant_bytes(&w).unwrap(), 24);
        assert_eq!(spirv_push_constant_bytes(&module()).unwrap(), 0);
    }

    /// Every reader refuses a short header, a bad magic, a zero word count and an
    /// instruction running past the end, naming which.
    #[test]
    fn malformed_modules_are_named_errors() {
        let mut bad_magic = module();
        bad_magic[0] = 0x0302_2307;
        let mut zero_count = module();
        zero_count[5] = 17; // OpCapability with word count 0
        let mut truncated = module();
        truncated.pop();
        let cases: [(&[u32], &str); 4] = [
            (&[SPIRV_MAGIC, 0, 0], "shorter than a SPIR-V header"),
            (&bad_magic, "bad magic"),
            (&zero_count, "instruction at word 5 has a bad word count 0"),
            (&truncated, "bad word count 4"),
        ];
        for (words, want) in cases {
            for got in [
                spirv_entry_points(words).map(|_| ()),
                spirv_capabilities(words).map(|_| ()),
                spirv_workgroup_bytes(words).map(|_| ()),
                spirv_push_constant_bytes(words).map(|_| ()),
            ] {
                let e = got.unwrap_err();
                assert!(e.contains(want), "{e} (want {want})");
            }
        }
    }
}
