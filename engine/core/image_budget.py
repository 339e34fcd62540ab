"""The step's image budget: how many vision-tower patches may be encoded and not yet consumed at once.

Counted in patches (an image's rows before the 2 x 2 merger, ImageInput.num_patches): every tower block holds
[patches, vision hidden] activations and its MLP [patches, intermediate], so patches are what the tower's time and
memory grow with; the output kept for the decoder is [patches / merge^2, hidden] (plus DeepStack's layers), so the
same count bounds it. vLLM counts encoder embeddings (tokens after the merger): the same quantity times merge^2.

A step's budget is the configured patches less those of images already encoded and held by running requests (an
output is held until every placeholder token of its image is computed: RequestImages.release). A chunk that would
reach an image whose tower has not run, when the image does not fit what is left, is cut just before the image's run
(possibly to no token), and no later request starts an image in that step: the image waits, first come first served,
until the held outputs are consumed. An image larger than the whole budget runs when nothing is held and no other
image is encoded in the step (alone), as vLLM raises its encoder budget to the largest item: every image runs, and
the memory bound is max(budget, the largest image)."""

from __future__ import annotations

from engine.multimodal.request_images import RequestImages


class ImageBudget:
    def __init__(self, max_patches: int) -> None:
        self.max_patches = max_patches
        self.start_step(0)

    def start_step(self, held: int) -> None:
        """held: patches whose outputs running requests hold from earlier steps."""
        self.left = self.max_patches - held
        self.held = held
        self.charged = 0  # patches of the images this step puts through the tower
        self.closed = False  # an image was refused this step: no later one starts (first come, first served)
        self._seen: set[tuple[int, int]] = set()  # (id of the request's images, image index) charged this step

    def fit(self, images: RequestImages | None, start: int, n: int) -> int:
        """How many of tokens start .. start + n - 1 may be computed this step: all of them, or those before the run
        of the first image that needs the tower and does not fit. Charges the images it lets through."""
        if images is None or n <= 0:
            return n
        for i, span in images.needing_tower(start, n):
            key = (id(images), i)
            if key in self._seen:  # already charged this step (a chunk extended after everyone's turn)
                continue
            patches = images.images[i].num_patches
            alone = self.held == 0 and self.charged == 0
            if self.closed or (patches > self.left and not alone):
                self.closed = True
                return max(0, span.start - start)
            self._seen.add(key)
            self.left -= patches
            self.charged += patches
        return n
