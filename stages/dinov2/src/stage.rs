//! The `vision_encoder` stage: image frames in, DINOv2 tokens out.

use crate::cards::DINOV2_VITS14;
use crate::encoder::{default_weights, load, Output, VisionEncoder};
use edgeflow_graph::{
    BuildEnv, Input, ParamInfo, ParamType, Params, Payload, PortSpec, PortType, Ports, Stage,
    StageCtx, StageError, StageFactory, StageInfo, StageResult,
};
use edgeflow_vision::{frame_to_rgb, Preprocess};
use std::time::Instant;

/// The `vision_encoder` stage kind.
#[derive(Debug)]
pub struct VisionEncoderKind;

/// Largest `image_size` accepted (74 x 74 patches).
const MAX_IMAGE_SIZE: u32 = 1036;

impl StageFactory for VisionEncoderKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "vision_encoder",
            doc: "DINOv2 ViT-S/14 on each image frame: resized to image_size (ImageNet normalisation), encoded on `device` (cpu | gpu | npu), emitted as an f32 tensor (`output`). Records `vision_encode_ms` per frame and the device's CPU fallbacks.",
            params: vec![
                ParamInfo::new("model", ParamType::String, "dinov2-vits14", "model card (`edgeflow models fetch dinov2-vits14`)"),
                ParamInfo::optional("weights", ParamType::InputPath, "a Dinov2 safetensors checkpoint under HF names instead of the card's (an upstream model.safetensors works; a config.json beside it is read)"),
                ParamInfo::new("image_size", ParamType::Int, 224, "square input side in pixels, 14..=1036; a multiple of 14 uses every pixel (e.g. 98, 112, 224), otherwise the right and bottom remainders are dropped as in HF"),
                ParamInfo::new("resize", ParamType::String, "stretch", "`stretch`: the whole frame resized to image_size (keeps the field of view); `crop`: HF's processor, shorter side to image_size * 256 / 224 then a center crop"),
                ParamInfo::new("output", ParamType::String, "cls", "`cls` [384], `patches` [N, 384], `all` [1 + N, 384] (the last hidden state), `mean` (mean patch token) [384], `grid` (patches average-pooled to grid x grid) [grid^2, 384]"),
                ParamInfo::new("grid", ParamType::Int, 4, "cells per side for output `grid`"),
            ],
            ports: Ports {
                inputs: vec![PortSpec::new("in", PortType::Image, "image frames (any size; RGB8, RGBA8 or grey)")],
                outputs: vec![PortSpec::new("out", PortType::Tensor, "f32 tokens on the host, see `output`")],
            },
            source: false,
        }
    }

    fn build(&self, p: &Params, env: &BuildEnv) -> std::result::Result<Box<dyn Stage>, StageError> {
        let card: String = p.get_or("model", DINOV2_VITS14.name.to_string())?;
        if card != DINOV2_VITS14.name {
            return Err(p
                .error(
                    "model",
                    format!(
                        "unknown model `{card}`: the only card is `{}`",
                        DINOV2_VITS14.name
                    ),
                )
                .into());
        }
        let size: u32 = p.get_or("image_size", 224)?;
        if !(14..=MAX_IMAGE_SIZE).contains(&size) {
            return Err(p
                .error(
                    "image_size",
                    format!("must be in 14..={MAX_IMAGE_SIZE}, got {size}"),
                )
                .into());
        }
        let pre = match p.get_or("resize", "stretch".to_string())?.as_str() {
            "stretch" => Preprocess::square(size),
            "crop" => Preprocess::dinov2(size),
            other => {
                return Err(p
                    .error(
                        "resize",
                        format!("unknown `{other}`: choose stretch or crop"),
                    )
                    .into())
            }
        };
        let output = Output::parse(
            &p.get_or("output", "cls".to_string())?,
            p.get_or("grid", 4)?,
        )
        .map_err(|e| p.error("output", e.to_string()))?;
        let path = match p.path("weights", env)? {
            Some(path) => path,
            None => default_weights()?,
        };
        let dev = env.open_device()?;
        let model = load(&path, &dev)?;
        Ok(Box::new(VisionEncoderStage {
            enc: VisionEncoder::new(model, pre, dev),
            output,
        }))
    }
}

/// The `vision_encoder` stage.
#[derive(Debug)]
pub struct VisionEncoderStage {
    enc: VisionEncoder,
    output: Output,
}

impl Stage for VisionEncoderStage {
    fn start(&mut self, ctx: &mut StageCtx) -> StageResult {
        ctx.attach_device(self.enc.device().stats().clone());
        Ok(())
    }

    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        let frame = match &input.msg.payload {
            Payload::Image(f) => f,
            // Events (flush, end of a take) carry no pixels.
            Payload::Event(_) => return Ok(()),
            other => {
                return Err(StageError::msg(format!(
                    "vision_encoder takes image frames, got {}: connect an image source (frames, zenoh_sub with type: image)",
                    other.type_name()
                )))
            }
        };
        let img = frame_to_rgb(frame)?;
        let t0 = Instant::now();
        let y = self.enc.encode(&img, self.output)?;
        ctx.record("vision_encode_ms", t0.elapsed().as_secs_f64() * 1e3);
        ctx.emit(0, Payload::Tensor(y))
    }
}
