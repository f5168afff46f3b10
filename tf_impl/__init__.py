"""The Transformer in TensorFlow 2 / Keras 3. Imports TensorFlow, Keras and `shared`, never torch."""
