"""The roles a pipeline's components play and the stages of a generation they are timed in, in the order the
pipelines run them: the one list the profile, the predictions, bench's timing and the reports read."""

DENOISER, TEXT_ENCODER, VAE_DECODER = "denoiser", "text_encoder", "vae_decoder"
#: what encodes an input image (the VAE's ``encode``, an image or vision encoder): once per input image and output
IMAGE_ENCODER = "image_encoder"
#: roles whose calls run a VAE, whose blocks may carry state between calls (Wan's causal-convolution caches): the
#: FLOPs counter and the memory tracker never reuse one block's run for an identical one there
VAE_ROLES = (VAE_DECODER, IMAGE_ENCODER)

#: the stage each role's calls are timed in, as ``bench`` stores them (``Stages``: ``<stage>_s``)
STAGE_OF_ROLE = {
    TEXT_ENCODER: "text_encoding",
    IMAGE_ENCODER: "image_encoding",
    DENOISER: "denoising",
    VAE_DECODER: "vae_decode",
}
STAGES = tuple(STAGE_OF_ROLE.values())
#: each stage as tables, plots and trace ranges name it
STAGE_NAMES = {
    "text_encoding": "text encoding",
    "image_encoding": "image encoding",
    "denoising": "denoising",
    "vae_decode": "VAE decode",
}
