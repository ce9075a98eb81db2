"""The dual-AR speech pieces the speech families share, through their public classes: the
talker (``talker.SpeechTalker``: the decoder stage's spec for a talker whose code predictor
completes each frame, a per-step sub-stage; a family subclasses it for its prompt layout and
sampling defaults), the code predictor (``code_predictor.CodePredictor``) and the vocoder stage
(``code2wav.Code2Wav``, a runner families declare as is). They name no family."""
