//! Recording one dispatch of a plan into a command encoder.

use super::plan::{Dispatch, Slot};
use super::GpuBackend;
use edgeflow_runtime::{Error, Result};
use wgpu::util::DeviceExt;

impl GpuBackend {
    /// Records one dispatch into `pass`.
    pub(super) fn encode(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        d: &Dispatch,
        bufs: &Buffers<'_>,
    ) -> Result<()> {
        if d.workgroups == 0 {
            return Ok(());
        }
        let pipe = self.pipeline(d.kernel)?;
        let params = self
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("edgeflow-params"),
                contents: bytemuck::cast_slice(&d.params),
                usage: wgpu::BufferUsages::STORAGE,
            });
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: params.as_entire_binding(),
        }];
        for (i, slot) in d.inputs.iter().chain([&d.out]).enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: bufs.get(*slot, &self.unbound)?.as_entire_binding(),
            });
        }
        let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("edgeflow-bind"),
            layout: &pipe.layout,
            entries: &entries,
        });
        let max = u64::from(self.limits.max_compute_workgroups_per_dimension.max(1));
        let x = d.workgroups.min(max);
        let y = d.workgroups.div_ceil(x);
        if y > max {
            return Err(self.err(format!(
                "{} workgroups exceed the adapter's dispatch limit",
                d.workgroups
            )));
        }
        pass.set_pipeline(&pipe.pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(x as u32, y as u32, 1);
        Ok(())
    }
}

/// The buffers of one op's execution, by [`Slot`].
pub(super) struct Buffers<'a> {
    pub(super) inputs: &'a [&'a wgpu::Buffer],
    pub(super) tmp: &'a [wgpu::Buffer],
    pub(super) out: &'a wgpu::Buffer,
}

impl Buffers<'_> {
    pub(super) fn get<'b>(
        &'b self,
        slot: Slot,
        unbound: &'b wgpu::Buffer,
    ) -> Result<&'b wgpu::Buffer> {
        let found = match slot {
            Slot::In(i) => self.inputs.get(i).copied(),
            Slot::Tmp(i) => self.tmp.get(i),
            Slot::Out => Some(self.out),
            Slot::Unbound => Some(unbound),
        };
        found.ok_or_else(|| Error::Backend {
            backend: "gpu".into(),
            msg: format!("internal: no buffer for {slot:?}"),
        })
    }
}
