-- clawgate state, schema 4: a polling source may resume from an opaque platform token (Matrix
-- `/sync`'s `next_batch`) rather than from a position alone: the token valid at the watermark is
-- kept beside it. NULL: the position is all the source needs (Telegram's offset).
ALTER TABLE polling_watermarks ADD COLUMN checkpoint TEXT;
